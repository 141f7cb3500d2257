package faulttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
			// Acknowledging past the limit is caught on the tenant's
			// distinct acknowledged series (history.OverLimit), which
			// names the tenant and draws nothing; a refused active
			// series is caught on its partition's key, drawn to html.
			if mode == "ack-before-commit" {
				if !strings.Contains(err.Error(), "over its limit") {
					t.Errorf("broken build %s: want the tenant over its limit named, got %v", mode, err)
				}
			} else if _, serr := os.Stat(html); serr != nil {
				t.Errorf("no visualisation written: %v", serr)
			}
			t.Logf("broken build %s caught in %v: %v", mode, time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// TestTrackHistoryCatchesBrokenBuild: the histories of the tests that call
// clientlib themselves (trackHistory: one operation per partition a call
// touches) must fail the check on a broken build too. forget-accepted, a
// limit of 300: 200 series are acknowledged, then the same 200 are sent
// with 200 new ones; at the limit the broken node also refuses one series
// per request that it acknowledged before.
func TestTrackHistoryCatchesBrokenBuild(t *testing.T) {
	bin := brokenBinary(t)
	t.Setenv("TOLLGATE_BROKEN", "forget-accepted") // the nodes inherit the test's environment
	c := newCluster(t, clusterOptions{defaultMaxSeries: 300, shareMode: "movable", bin: bin})
	cl := clockClient(t, c)
	const tn = "broken-th"
	th := c.recordTracks(map[string]int{tn: 300})
	first := seriesOf(200, 1)
	if rej := th.trackAll(t, cl, tn, first); len(rej) != 0 {
		t.Fatalf("first 200 series: %d refused under a limit of 300", len(rej))
	}
	rej := th.trackAll(t, cl, tn, append(slices.Clone(first), seriesOf(200, 2)...))
	t.Logf("the same 200 and 200 new at a limit of 300: %d refused", len(rej))
	html := strings.TrimSuffix(th.h.Path(), ".jsonl") + ".html"
	err := th.checkErr()
	if !errors.Is(err, history.ErrNotLinearizable) {
		t.Fatalf("history check = %v, want a linearizability violation", err)
	}
	if _, serr := os.Stat(html); serr != nil {
		t.Errorf("no visualisation written: %v", serr)
	}
	t.Logf("caught: %v", err)
}
