package layout_test

import (
	"os/exec"
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
