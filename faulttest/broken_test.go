package faulttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/faulttest/history"
)

var (
	brokenOnce sync.Once
	brokenBin  string
	brokenErr  error
)

// brokenBinary builds tollgate with the tollgate_broken tag (server's
// broken_build.go): the same server, plus bugs picked by $TOLLGATE_BROKEN.
// No production build uses that tag. TestMain removes it.
func brokenBinary(t *testing.T) string {
	t.Helper()
	brokenOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			brokenErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tollgate-faulttest-broken-")
		if err != nil {
			brokenErr = err
			return
		}
		brokenBin = filepath.Join(dir, "tollgate-broken")
		cmd := exec.Command("go", "build", "-tags", "tollgate_broken", "-o", brokenBin, "./cmd/tollgate")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			brokenErr = fmt.Errorf("go build -tags tollgate_broken ./cmd/tollgate: %v\n%s", err, out)
		}
	})
	if brokenErr != nil {
		t.Fatal(brokenErr)
	}
	return brokenBin
}

// TestCheckerCatchesBrokenBuilds runs the fault tests' load against three
// real clusters of deliberately broken servers (real processes, real raft;
// the bug is compiled in only with the tollgate_broken tag) and requires the
// porcupine check of the recorded history to report a violation for each:
//
//   - ack-before-commit: the leader answers "accepted" at once and decides
//     afterwards, so series are acknowledged past the limit;
//   - lost-write: every fourth acknowledged request is never proposed, so a
//     re-send of one of its series can later be refused at the limit;
//   - forget-accepted: at the limit, the node also refuses one series it
//     acknowledged before.
//
// A checker that passes these builds could not be trusted to pass the
// correct one for a reason.
func TestCheckerCatchesBrokenBuilds(t *testing.T) {
	bin := brokenBinary(t)
	for _, mode := range []string{"ack-before-commit", "lost-write", "forget-accepted"} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv("TOLLGATE_BROKEN", mode) // the nodes inherit the test's environment
			opts := defaultClusterOptions()
			opts.bin = bin
			c := newCluster(t, opts)
			ck := startChecker(t, c, defaultCheckerConfig())
			ck.waitProgress("start")
			loadFor(12 * time.Second)
			ck.Stop()
			start := time.Now()
			html := filepath.Join(c.dir, "history.html")
			err := ck.CheckHistory(html, 2*time.Minute)
			if !errors.Is(err, history.ErrNotLinearizable) {
				t.Fatalf("broken build %s: history check = %v, want a linearizability violation", mode, err)
			}
			if _, serr := os.Stat(html); serr != nil {
				t.Errorf("no visualisation written: %v", serr)
			}
			t.Logf("broken build %s caught in %v: %v", mode, time.Since(start).Round(time.Millisecond), err)
		})
	}
}
