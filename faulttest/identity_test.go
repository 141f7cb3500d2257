package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// wipedIncarnationMarker is the text a node whose data dir was replaced
// reports (log and /readyz) while it stays out of the groups that still list
// its earlier incarnation; docs/operations.md and docs/cluster.md document it.
const wipedIncarnationMarker = "new incarnation"

// TestWipedDiskRejoin: three nodes under continuous tracking load; node-2 is
// frozen (SIGSTOP) so it falls behind while series are acknowledged through
// node-1 and node-3; node-3 is SIGKILLed and its data dir deleted (a replaced
// disk); node-1 is SIGKILLed; node-3 is started again with the same flags and
// node-2 resumed (SIGCONT); then node-1 is started. Only one disk was lost
// and node-1 still holds every acknowledged series, so none may be lost: each
// group's state (a snapshot taken on its leader after a barrier) must hold
// every hash the checker saw acknowledged. The checker re-sends no
// acknowledged hash, so a lost series cannot be created again and hide. The
// wiped node must end either as a healthy voter of every group or refused
// with the documented error.
//
//	TOLLGATE_WIPE_RUNS=10 go test -count=1 -run TestWipedDiskRejoin -v ./faulttest/
//
// Without the variable it runs once.
func TestWipedDiskRejoin(t *testing.T) {
	runs := wipeRuns(t)
	passed := 0
	for i := 1; i <= runs; i++ {
		if t.Run(fmt.Sprintf("run-%d", i), func(t *testing.T) {
			c, ck := wipedDiskScenario(t, defaultClusterOptions())
			outcome := waitWipedOutcome(t, c, c.nodes[2])
			t.Logf("wiped %s: %s", c.nodes[2].id, outcome)
			finishWiped(t, c, ck)
		}) {
			passed++
		}
	}
	t.Logf("wiped-disk reproduction: %d of %d runs lost no acknowledged series and ended with the wiped node a healthy voter or refused", passed, runs)
}

// TestWipedDiskManualReplace: the same reproduction on servers started with
// --disable-auto-place, so no leader replaces the wiped node's earlier
// incarnation: it must stay out with the documented error (/readyz) while the
// others serve, and the commands that error names (tollgate raft
// remove-server, then add-voter, for every group) make it a healthy voter.
func TestWipedDiskManualReplace(t *testing.T) {
	opts := defaultClusterOptions()
	opts.extraArgs = append(opts.extraArgs, "--disable-auto-place")
	c, ck := wipedDiskScenario(t, opts)
	n3 := c.nodes[2]
	start := time.Now()
	why := ""
	for time.Since(start) < healthyTimeout {
		if why = readyzBody(n3); strings.Contains(why, wipedIncarnationMarker) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(why, wipedIncarnationMarker) {
		t.Fatalf("%s: /readyz %q, want the documented error (%q)", n3.id, why, wipedIncarnationMarker)
	}
	for _, cmd := range []string{"remove-server", "add-voter"} {
		if !strings.Contains(why, "tollgate raft "+cmd) {
			t.Errorf("/readyz does not name the recovery command %q: %s", cmd, why)
		}
	}
	t.Logf("%s refused as documented: %s", n3.id, why)
	if m := metricLine(n3, `tollgate_raft_refused_connections_total{reason="incarnation"}`); m == "" {
		t.Errorf("%s: /metrics has no refused-connection count for the earlier incarnation", n3.id)
	} else {
		t.Logf("%s: %s", n3.id, m)
	}
	// Stays out: it is still refused a while later (nothing replaces it).
	loadFor(3 * time.Second)
	if why := readyzBody(n3); !strings.Contains(why, wipedIncarnationMarker) {
		t.Fatalf("%s no longer refused without an operator: /readyz %q", n3.id, why)
	}
	ck.waitProgress("wiped node refused")

	for _, cmd := range []string{"remove-server", "add-voter"} {
		// remove-server refuses while gossip still counts node-2 (SIGCONTed
		// a moment ago) as down, since the removal would then leave no
		// running quorum; an operator runs it again once status shows
		// node-2 alive, and so does this test.
		var out []byte
		var err error
		for deadline := time.Now().Add(progressTimeout); ; {
			out, err = exec.Command(c.bin, "raft", cmd, "--all-groups", "--id", n3.id, "--addr", c.nodes[0].grpcAddr, "--token", adminToken).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "of which only") || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil {
			t.Fatalf("tollgate raft %s --all-groups --id %s: %v\n%s", cmd, n3.id, err, out)
		}
		t.Logf("tollgate raft %s --all-groups --id %s:\n%s", cmd, n3.id, strings.TrimSpace(string(out)))
	}
	outcome := waitWipedOutcome(t, c, n3)
	if !strings.HasPrefix(outcome, "healthy") {
		t.Fatalf("after remove-server and add-voter: %s", outcome)
	}
	t.Logf("wiped %s after the documented commands: %s", n3.id, outcome)
	finishWiped(t, c, ck)
}

func wipeRuns(t *testing.T) int {
	if v := os.Getenv("TOLLGATE_WIPE_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TOLLGATE_WIPE_RUNS=%q: want a positive integer", v)
		}
		return n
	}
	return 1
}

// wipedDiskScenario runs the reproduction up to node-1's restart and the
// return of progress, checking on the way that nothing was led while node-1,
// the only full copy, was down: the stale node-2 can only win with the wiped
// node-3's vote.
func wipedDiskScenario(t *testing.T, opts clusterOptions) (*cluster, *ckr) {
	c := newCluster(t, opts)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	cfg := defaultCheckerConfig()
	cfg.ResendMax = 0
	ck := startChecker(t, c, cfg)
	ck.waitProgress("start")
	loadFor(2 * time.Second)

	n2.stop(t)
	ck.waitProgress("SIGSTOP of node-2")
	before := countAcked(ck.AckedHashes())
	loadFor(5 * time.Second)
	t.Logf("%d series acknowledged through node-1 and node-3 while node-2 was frozen (%d in all)", countAcked(ck.AckedHashes())-before, countAcked(ck.AckedHashes()))

	// Each group's term now: a leader elected while node-1 is down has a
	// higher one. node-2 may still call itself leader of a group it led
	// before its SIGSTOP for a moment after SIGCONT (until its lease check
	// steps it down); that stale term is lower, and it can commit nothing.
	termsBefore := make([]uint64, groups)
	for _, ng := range c.nodeGroups() {
		for _, gs := range ng.Groups {
			termsBefore[gs.Group] = max(termsBefore[gs.Group], gs.Term)
		}
	}
	n3.kill(t)
	if err := os.RemoveAll(n3.dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: data dir %s deleted", n3.id, n3.dir)
	n1.kill(t)

	if _, err := n3.start(); err != nil {
		t.Fatal(err)
	}
	n2.cont(t)
	// Give node-2 and the wiped node-3 the time to elect leaders among
	// themselves before node-1 is back: none may be elected.
	var led []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && len(led) == 0 {
		for g := range groups {
			if l, term := c.leaderOf(g); l != nil && term > termsBefore[g] {
				led = append(led, fmt.Sprintf("group %d by %s in term %d (was %d)", g, l.id, term, termsBefore[g]))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(led) > 0 {
		t.Errorf("led while node-1 was down (%s): the wiped node voted as its former self", strings.Join(led, ", "))
	}
	t.Logf("before node-1 is back: leaders %s", c.describe())
	n1.restart(t)
	ck.waitProgress("restart of node-1")
	return c, ck
}

// finishWiped stops the load, checks every acknowledged series is still held,
// then runs the checker's sweep and report.
func finishWiped(t *testing.T, c *cluster, ck *ckr) {
	t.Helper()
	loadFor(2 * time.Second)
	ck.Stop()
	lost, total := lostSeries(t, c, c.nodes[0], ck.AckedHashes())
	t.Logf("acknowledged series: %d; lost: %d", total, lost)
	if lost > 0 {
		t.Errorf("%d of %d acknowledged series lost (must be 0)", lost, total)
	}
	ck.Sweep()
	ck.Report()
	ck.checkHistory()
	c.checkNoCrashes()
}

func countAcked(m map[string][]uint64) int {
	n := 0
	for _, hs := range m {
		n += len(hs)
	}
	return n
}

// waitWipedOutcome waits until the wiped node is a healthy voter of every
// group (the whole cluster healthy) or, failing that within the bound, checks
// it is refused: its /readyz names the documented reason. (Its earlier
// incarnation may still be listed; the transport refuses to let the new one
// answer for it.)
func waitWipedOutcome(t *testing.T, c *cluster, n *node) string {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < healthyTimeout {
		if last = c.health(); last == "" {
			return fmt.Sprintf("healthy voter of every group after %v", time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
	why := readyzBody(n)
	if !strings.Contains(why, wipedIncarnationMarker) {
		t.Fatalf("%s is neither a healthy voter (%s) nor refused with the documented error (/readyz: %q)", n.id, last, why)
	}
	return "refused: " + why
}

// metricLine returns the /metrics line of n starting with name, "" if none.
func metricLine(n *node, name string) string {
	resp, err := http.Get("http://" + n.httpAddr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return ""
}

// lostSeries reads every group's state from its leader (SnapshotGroup runs a
// barrier first) and counts the acknowledged hashes it does not hold.
func lostSeries(t *testing.T, c *cluster, via *node, acked map[string][]uint64) (lost, total int) {
	t.Helper()
	have := make([]map[string]map[uint64]bool, groups)
	for g := range groups {
		var data []byte
		adminRetry(t, fmt.Sprintf("SnapshotGroup(%d)", g), func(ctx context.Context) error {
			st, err := c.admin(via).SnapshotGroup(ctx, &api.SnapshotGroupRequest{Group: uint32(g)})
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			for {
				ch, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				buf.Write(ch.Data)
			}
			data = buf.Bytes()
			return nil
		})
		rd, err := snapfmt.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("group %d snapshot: %v", g, err)
		}
		names := rd.Header().Tenants
		have[g] = map[string]map[uint64]bool{}
		for {
			_, series, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("group %d snapshot: %v", g, err)
			}
			for _, ts := range series {
				name := names[ts.Tenant]
				if have[g][name] == nil {
					have[g][name] = map[uint64]bool{}
				}
				for _, h := range ts.Hashes {
					have[g][name][h] = true
				}
			}
		}
	}
	perGroup := make([]int, groups)
	for tenant, hs := range acked {
		for _, h := range hs {
			total++
			g := api.GroupOf(api.Partition(h, partitions), partitions, groups)
			if !have[g][tenant][h] {
				lost++
				perGroup[g]++
			}
		}
	}
	if lost > 0 {
		t.Logf("lost acknowledged series per group: %v", perGroup)
	}
	return lost, total
}

// earlierBinEnv names a tollgate binary built before node identities (for
// example from the commit before them: git archive REV | tar -x -C DIR; go
// build ./cmd/tollgate).
const earlierBinEnv = "TOLLGATE_EARLIER_BIN"

// TestUpgradeAdoptsIdentity: a cluster of an earlier build (no identity.json,
// plain raft addresses) is upgraded node by node under load. Each data dir
// adopts an identity on its first start and keeps its state (no resync: the
// configurations keep the plain addresses the earlier build wrote, which the
// adopted identities serve); no acknowledged series is lost. Then a node's
// disk is wiped: the new incarnation refuses the plain address its earlier
// self had, and is replaced and promoted through the non-voter path.
func TestUpgradeAdoptsIdentity(t *testing.T) {
	earlier := os.Getenv(earlierBinEnv)
	if earlier == "" {
		t.Skipf("%s is not set: this test needs a tollgate binary of a build before node identities", earlierBinEnv)
	}
	current := tollgateBinary(t)
	opts := defaultClusterOptions()
	opts.bin = earlier
	c := newCluster(t, opts)
	cfg := defaultCheckerConfig()
	cfg.ResendMax = 0
	ck := startChecker(t, c, cfg)
	ck.waitProgress("start")
	loadFor(2 * time.Second)

	c.bin = current
	for _, n := range c.nodes {
		if _, err := os.Stat(filepath.Join(n.dir, "identity.json")); err == nil {
			t.Fatalf("%s: the earlier build wrote identity.json", n.id)
		}
		n.term(t)
		ck.waitProgress("SIGTERM of " + n.id)
		n.restart(t)
		c.waitHealthy()
		ck.waitProgress("upgrade of " + n.id)
		b, err := os.ReadFile(filepath.Join(n.dir, "identity.json"))
		if err != nil || !strings.Contains(string(b), `"adopted": true`) {
			t.Fatalf("%s: identity after the upgrade start: %s, %v", n.id, b, err)
		}
		loadFor(time.Second)
	}
	for g := range groups {
		l, _ := c.leaderOf(g)
		if l == nil {
			t.Fatalf("group %d has no leader", g)
		}
		peers, err := c.listPeers(l, g)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range peers {
			if strings.Contains(p.Address, "#") {
				t.Errorf("group %d: %s listed at %s: an upgraded node's plain address was rewritten", g, p.Id, p.Address)
			}
		}
	}

	n3 := c.nodes[2]
	n3.kill(t)
	if err := os.RemoveAll(n3.dir); err != nil {
		t.Fatal(err)
	}
	n3.restart(t)
	ck.waitProgress("restart of wiped " + n3.id)
	outcome := waitWipedOutcome(t, c, n3)
	if !strings.HasPrefix(outcome, "healthy") {
		t.Fatalf("wiped %s: %s", n3.id, outcome)
	}
	for g := range groups {
		l, _ := c.leaderOf(g)
		peers, err := c.listPeers(l, g)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range peers {
			if p.Id == n3.id && !strings.Contains(p.Address, "#") {
				t.Errorf("group %d: wiped %s still listed at its plain address %s", g, p.Id, p.Address)
			}
		}
	}
	t.Logf("wiped %s after the upgrade: %s", n3.id, outcome)
	finishWiped(t, c, ck)
}

// readyzBody is /readyz's answer body (or the error reaching it).
func readyzBody(n *node) string {
	_, body := readyz(n) // disk_test.go
	return body
}
