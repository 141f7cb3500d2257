package layout_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestStateLinksNoRPC keeps the dependency direction of the design: the state
// machine and the backup format know nothing of gRPC or protobuf, so they can be
// reasoned about (and fuzzed) without the wire.
func TestStateLinksNoRPC(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH: cannot list dependencies")
	}
	for _, pkg := range []string{"../fsm/...", "../backup", ".", "../limits", "./handoff"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "google.golang.org/grpc") || strings.HasPrefix(dep, "google.golang.org/protobuf") ||
				dep == "github.com/tollgate-io/tollgate/api" {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}

// TestServerSideImportsNoClientlib keeps the client library a leaf: no package
// of the server side links clientlib, directly or through another package, so
// a change made for clients can never change what a node decides. Only
// clientlib itself and the binary (cmd/..., whose client commands use it) may.
// Test files are not counted: a test may drive a real node with the client.
func TestServerSideImportsNoClientlib(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	const mod = "github.com/tollgate-io/tollgate/"
	out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s...: %v\n%s", mod, err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := f[0]
		if isUnder(pkg, mod+"clientlib") || isUnder(pkg, mod+"cmd") {
			continue
		}
		checked++
		for _, dep := range f[1:] {
			if isUnder(dep, mod+"clientlib") {
				t.Errorf("%s depends on %s: the server side must not link the client library (move what both need into a package of its own, as sampleconf)", pkg, dep)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d server-side packages listed: is the module layout what this test expects?", checked)
	}
}

func isUnder(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }
