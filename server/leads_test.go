package server

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOneLeadershipPredicate: "this node leads group g" is defined once,
// Server.leads; what each capability asks through its own port (Leads,
// IsLeader) answers with it. Five definitions that differed (one checked the
// clock bound, one the barrier, one neither) are how a capability once kept
// deciding on a node that the others had stopped deciding on.
func TestOneLeadershipPredicate(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	port := regexp.MustCompile(`func \([^)]*\) (Leads|IsLeader|Owns|leads)\(g int\) bool \{(.*)`)
	// Raft leadership and the session barrier in one expression (readiness's
	// "leader whose barrier has not passed", !tr.ready(), is another
	// question).
	pred := regexp.MustCompile(`raft\.Leader.*\.ready\(\)`)
	defs := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if pred.MatchString(line) && !strings.Contains(line, "!tr.ready()") {
				defs++
				if f != "versions.go" {
					t.Errorf("%s:%d combines raft leadership and the session barrier itself; use s.leads(g)", f, i+1)
				}
			}
			if m := port.FindStringSubmatch(line); m != nil && m[1] != "leads" && !strings.Contains(m[2], ".leads(g)") {
				t.Errorf("%s:%d: %s answers without s.leads(g): %s", f, i+1, m[1], strings.TrimSpace(line))
			}
		}
	}
	if defs != 1 {
		t.Errorf("%d definitions of the leadership predicate, want 1 (Server.leads in versions.go)", defs)
	}
}
