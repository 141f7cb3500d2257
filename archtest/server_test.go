package archtest

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const mod = "github.com/tollgate-io/tollgate/"

// pkgInfo is one package of the module as go list sees it: what it imports
// directly (non-test files) and everything it links.
type pkgInfo struct {
	imports, deps []string
}

// listModule lists every package of the module.
func listModule(t *testing.T) map[string]pkgInfo {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}`, mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s...: %v\n%s", mod, err, out)
	}
	pkgs := map[string]pkgInfo{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list line %q: want path|imports|deps", line)
		}
		pkgs[f[0]] = pkgInfo{imports: strings.Fields(f[1]), deps: strings.Fields(f[2])}
	}
	if len(pkgs) < 30 {
		t.Fatalf("only %d packages listed: is the module layout what this test expects?", len(pkgs))
	}
	return pkgs
}

// isHarness: a package whose job is to drive real nodes for tests
// (server/servertest, faulttest/...): by the house's naming, its name ends
// in "test".
func isHarness(pkg string) bool {
	for p := strings.TrimPrefix(pkg, mod); p != "." && p != ""; p = path.Dir(p) {
		if strings.HasSuffix(path.Base(p), "test") {
			return true
		}
	}
	return false
}

// TestNothingImportsServer keeps server the top of the node. access,
// cluster and clockbound are what server wires, so none links it, directly or through
// another package; and no package imports server except the binary
// (cmd/...) and test harnesses. A package that needs something of the
// server's gets it through a port of its own (nodeport, cluster's port),
// never by importing the room that wires everything. Test files are not
// counted: a test may start a real node.
func TestNothingImportsServer(t *testing.T) {
	pkgs := listModule(t)
	const server = mod + "server"
	for _, want := range []string{"access", "cluster", "clockbound"} {
		found := 0
		for pkg, info := range pkgs {
			if !isUnder(pkg, mod+want) {
				continue
			}
			found++
			for _, dep := range info.deps {
				if isUnder(dep, server) {
					t.Errorf("%s links %s: %s is wired by server and must not depend on it (give it a port, as nodeport)", pkg, dep, want)
				}
			}
		}
		switch {
		case found > 0:
		case want == "cluster":
			// Cluster control moves out of server/ (issue 35); until
			// cluster/ exists there is nothing to check, and this says so.
			t.Logf("no package %s yet: the rule that cluster links no server is not checked", mod+want)
		default:
			t.Errorf("no package %s: it holds the node's access control", mod+want)
		}
	}
	for pkg, info := range pkgs {
		if isUnder(pkg, mod+"cmd") || isHarness(pkg) || pkg == server {
			continue
		}
		for _, imp := range info.imports {
			if imp == server {
				t.Errorf("%s imports %s: only the binary (cmd/...) and test harnesses may; give it a port or move what it needs out of server", pkg, imp)
			}
		}
	}
}

// serverLineBar is issue 35's bar for server/: at most this many lines of
// non-test Go. Reported, not yet enforced: the cluster and capability
// moves that bring it under land separately.
const serverLineBar = 7000

// TestServerSize reports the lines of non-test Go under server/ (as `find
// server -name '*.go' ! -name '*_test.go' | xargs wc -l` counts them)
// against the bar, and fails over it: server/ wires the node, it does not
// grow concerns of its own.
func TestServerSize(t *testing.T) {
	lines, files := 0, 0
	err := filepath.WalkDir(filepath.Join("..", "server"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		lines += bytes.Count(b, []byte("\n"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no Go files under server/: is the module layout what this test expects?")
	}
	t.Logf("server/: %d lines of non-test Go in %d files; bar %d", lines, files, serverLineBar)
	if lines > serverLineBar {
		t.Errorf("server/ holds %d lines of non-test Go, over %d: a concern that grew there belongs in a package of its own (cluster, access, clockbound, service/<name>)", lines, serverLineBar)
	}
}
