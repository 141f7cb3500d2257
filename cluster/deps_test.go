package cluster

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoServer keeps cluster control below the node: it reaches the
// node only through its port (port.go), which package server implements, so
// nothing cluster links, directly or through another package, is server.
func TestImportsNoServer(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH: cannot list dependencies")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/tollgate-io/tollgate/server" || strings.HasPrefix(dep, "github.com/tollgate-io/tollgate/server/") {
			t.Errorf("package cluster depends on %s: reach the node through the port instead", dep)
		}
	}
}
