package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/limits"
)

// TestKeysSpelledOnce: outside package limits, no non-test Go file spells a
// runtime-config key as a string literal ("max_series", or a set key such
// as "sample_rates.locate"); it names the Key* constant. Docs, YAML
// examples and tests may spell them. KeyUnlimited is left out: "unlimited"
// is also an ordinary word that status pages and labels print.
func TestKeysSpelledOnce(t *testing.T) {
	keys := []string{limits.KeyMaxSeries, limits.KeyMaxSeriesPerPartition, limits.KeyIngestionRate, limits.KeyIngestionBurst, limits.KeySampleRates}
	spells := func(s string) bool {
		for _, k := range keys {
			if s == k || strings.HasPrefix(s, k+".") {
				return true
			}
		}
		return false
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	here, _ := filepath.Abs(filepath.Join("..", "limits")) // the one package that spells them
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == here || path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && spells(s) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %s spells a runtime-config key; use the limits.Key* constant", rel, fset.Position(lit.Pos()).Line, lit.Value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files from %s: not the repository?", files, root)
	}
}
