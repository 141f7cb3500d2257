package archtest

import (
	"os"
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
	for _, pkg := range []string{"../fsm/...", "../backup", "../layout", "../limits", "../layout/handoff"} {
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
// clientlib itself, the remote-write gateway (gateway/..., a client of the
// cluster) and the binary (cmd/..., whose client commands use it) may; no
// server-side package links the gateway either.
// Test files are not counted: a test may drive a real node with the client.
func TestServerSideImportsNoClientlib(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s...: %v\n%s", mod, err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := f[0]
		if isUnder(pkg, mod+"clientlib") || isUnder(pkg, mod+"cmd") || isUnder(pkg, mod+"gateway") {
			continue
		}
		checked++
		for _, dep := range f[1:] {
			if isUnder(dep, mod+"clientlib") {
				t.Errorf("%s depends on %s: the server side must not link the client library (move what both need into a package of its own, as sampleconf)", pkg, dep)
			}
			if isUnder(dep, mod+"gateway") {
				t.Errorf("%s depends on %s: the server side must not link the remote-write gateway", pkg, dep)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d server-side packages listed: is the module layout what this test expects?", checked)
	}
}

func isUnder(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// TestCapabilityPackagesLineUp keeps one name per capability on every side:
// a replicated capability's FSM module fsm/<name> (a package that registers
// its entry types with fsm.RegisterModuleEntry), the package that
// serves it service/<name>, and the client package clientlib/<name>. Reading
// one capability means opening the three folders of one name.
func TestCapabilityPackagesLineUp(t *testing.T) {
	dirs := func(parent string) []string {
		ents, err := os.ReadDir(filepath.Join("..", parent))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			if e.IsDir() && e.Name() != "testdata" {
				out = append(out, e.Name())
			}
		}
		return out
	}
	services := map[string]bool{}
	for _, d := range dirs("service") {
		services[d] = true
		if _, err := os.Stat(filepath.Join("..", "service", d, "doc.go")); err != nil {
			t.Errorf("service/%s has no doc.go saying what it serves", d)
		}
	}
	if len(services) < 5 {
		t.Fatalf("only %d service packages: is the module layout what this test expects?", len(services))
	}
	for _, d := range dirs("clientlib") {
		if !services[d] {
			t.Errorf("clientlib/%s has no service/%s: name the client after the capability it serves", d, d)
		}
	}
	modules := 0
	for _, d := range dirs("fsm") {
		if !registersEntries(t, filepath.Join("..", "fsm", d)) {
			continue // a building block (seriesmap, snapfmt, wire), not a capability
		}
		modules++
		if !services[d] {
			t.Errorf("FSM module fsm/%s has no service/%s: name the serving package after the state it serves", d, d)
		}
	}
	if modules < 3 {
		t.Fatalf("only %d FSM modules register entry types: is the module layout what this test expects?", modules)
	}
}

// registersEntries reports whether a non-test Go file in dir registers FSM
// entry types.
func registersEntries(t *testing.T, dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "fsm.RegisterModuleEntry(") {
			return true
		}
	}
	return false
}
