package limits

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func p[T any](v T) *T { return &v }

// TestResolve: a scope's key replaces the one before it; a key left out
// inherits; an explicit zero ("no limit") is a value, not "unset".
func TestResolve(t *testing.T) {
	base := Effective{MaxSeries: 100, IngestionRate: 5}
	defaults := Overrides{MaxSeries: p(int64(1000)), IngestionBurst: p(int64(7))}
	tenant := Overrides{MaxSeries: p(int64(0)), IngestionRate: p(2.5)}
	for name, c := range map[string]struct {
		got, want Effective
	}{
		"base only":           {Resolve(base), base},
		"defaults over base":  {Resolve(base, defaults), Effective{MaxSeries: 1000, IngestionRate: 5, IngestionBurst: 7}},
		"tenant over both":    {Resolve(base, defaults, tenant), Effective{MaxSeries: 0, IngestionRate: 2.5, IngestionBurst: 7}},
		"tenant, no defaults": {Resolve(base, Overrides{}, tenant), Effective{MaxSeries: 0, IngestionRate: 2.5}},
	} {
		if c.got != c.want {
			t.Errorf("%s: %+v, want %+v", name, c.got, c.want)
		}
	}
}

// TestOneInheritanceRule: only this package copies a scope's key over an
// inherited value (the statement the rule is made of). The server, the state
// machine and the client library each had a copy of the rule once.
func TestOneInheritanceRule(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	here, _ := filepath.Abs(".")
	rule := regexp.MustCompile(`\.(MaxSeries|MaxSeriesPerPartition|IngestionRate|IngestionBurst) = \*`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == here || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if loc := rule.FindIndex(b); loc != nil {
			t.Errorf("%s: %q re-implements limit inheritance; use limits.Resolve", path, b[loc[0]:loc[1]])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
