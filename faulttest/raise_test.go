package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// TestRaiseMovesThroughKills is the fault bar of raising the group count
// online: a 3-node cluster of real processes, under recorded clientlib load
// whose tenants reach their limits, raises its group count from G to 2G;
// every node serves the new groups without a restart. While group 0's
// leader moves the partitions (each step slowed by TOLLGATE_TEST_MOVE_STEP_PAUSE so that the
// kills land between a move's steps), the coordinator's node, a move's source
// leader and its destination leader are SIGKILLed and restarted, one each.
// The moves finish; the callers see no error and no fail-open decision more
// than 2 s after a kill; the recorded history checks (no acknowledged series
// refused later, no tenant above its limit).
func TestRaiseMovesThroughKills(t *testing.T) {
	// 32 moves of 4 steps: about 50 s of moves, so that the three kills
	// (each a restart and a wait for health) land mid-move on a loaded
	// machine too.
	t.Setenv("TOLLGATE_TEST_MOVE_STEP_PAUSE", "400ms")
	const limit = 3000
	limits := map[string]int{"zd-0": limit, "zd-1": limit, "zd-2": limit, "zd-3": limit}
	c := newCluster(t, clusterOptions{tenantMaxSeries: map[string]int64{"zd-0": limit, "zd-1": limit, "zd-2": limit, "zd-3": limit}})
	load := startRecordedLoad(t, c, 4, c.recordTracks(limits))
	defer load.close()
	loadFor(2 * time.Second)

	const to = 2 * groups
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	for {
		actx, acancel := adminCtx(ctx, 10*time.Second)
		_, err = c.admin(c.nodes[0]).RaiseGroups(actx, &api.RaiseGroupsRequest{To: to})
		acancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("raise to %d: %v", to, err)
	}
	var kills []time.Time
	kill := func(n *node, why string) {
		t.Logf("SIGKILL %s (%s)", n.id, why)
		kills = append(kills, time.Now())
		n.kill(t)
		n.restart(t)
		c.waitHealthy()
	}
	status := func() *api.PartitionMovesStatus { return c.partitionMoves(ctx) }
	// The current move's groups, from status ("partition P: group A → B").
	current := regexp.MustCompile(`group (\d+) → (\d+)`)
	waitMove := func() (src, dst int) {
		for ctx.Err() == nil {
			pm := status()
			if pm != nil && pm.GetPending() > 0 {
				if m := current.FindStringSubmatch(pm.GetCurrent()); m != nil {
					src, _ = strconv.Atoi(m[1])
					dst, _ = strconv.Atoi(m[2])
					return src, dst
				}
			}
			if pm != nil && pm.GetPending() == 0 && pm.GetGroups() == to {
				t.Fatal("every move finished before the next kill: the kills did not land mid-move (slow restarts? raise TOLLGATE_TEST_MOVE_STEP_PAUSE)")
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatal("no move under way")
		return 0, 0
	}
	started := time.Now()
	waitMove()
	coord, _ := c.leaderOf(0)
	if coord == nil {
		t.Fatal("group 0 has no leader")
	}
	kill(coord, "the coordinator's node, mid-move")
	from, _ := waitMove()
	if l, _ := c.leaderOf(from); l != nil {
		kill(l, fmt.Sprintf("group %d's leader, a move's source", from))
	}
	_, dst := waitMove()
	if l, _ := c.leaderOf(dst); l != nil {
		kill(l, fmt.Sprintf("group %d's leader, a move's destination", dst))
	}
	for {
		pm := status()
		if pm != nil && pm.GetPending() == 0 && pm.GetGroups() == to {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("moves not finished 5 minutes into the test: %+v", pm)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("every partition at its owner for %d groups %v after the first move was seen, through 3 kills", to, time.Since(started).Round(time.Second))
	loadFor(2 * time.Second)
	load.close()
	load.mu.Lock()
	nFail := len(load.failures)
	load.mu.Unlock()
	outside := load.failuresOutside(kills, 2*time.Second)
	st := load.cl.Stats()
	t.Logf("load: %d requests, %d errors or fail-open decisions (%d more than 2 s after a kill); %d Moved answers followed", load.requests.Load(), nFail, len(outside), st.Moved)
	for i, f := range outside {
		if i == 5 {
			break
		}
		t.Errorf("a caller saw a failure at %s, not within 2 s of a kill: %s", f.at.Format("15:04:05.000"), f.what)
	}
	// Each tenant's shares and series per group, for the log (and the
	// check: Σ shares = the limit, Σ series ≤ it).
	for tn := range limits {
		actx, acancel := adminCtx(ctx, 5*time.Second)
		ts, err := api.NewSharesClient(c.conn(c.nodes[0].grpcAddr)).TenantShares(actx, &api.TenantSharesRequest{Tenant: tn})
		acancel()
		if err != nil {
			t.Errorf("TenantShares %s: %v", tn, err)
			continue
		}
		var share, series int64
		var line string
		for _, g := range ts.GetGroups() {
			share += g.GetShare()
			series += g.GetSeries()
			line += fmt.Sprintf(" g%d:%d/%d(d%+d,out%d)", g.GetGroup(), g.GetSeries(), g.GetShare(), g.GetDelta(), len(g.GetOutstanding()))
		}
		t.Logf("%s: series %d, shares %d:%s", tn, series, share, line)
		if series > limit {
			t.Errorf("%s holds %d series, over its limit %d", tn, series, limit)
		}
	}
	load.th.check()
	c.checkNoCrashes()
}

// previousBinEnv names a tollgate binary of the release before online groups
// (cluster version 6 or below), for TestRollingUpgradeThenRaise.
const previousBinEnv = "TOLLGATE_PREVIOUS_BIN"

// TestRollingUpgradeThenRaise: a cluster created by the build before online
// groups (every node started with cluster version 5, the version before
// layout-raise, as TestRollingUpgrade makes a current binary the previous
// build; or, with $TOLLGATE_PREVIOUS_BIN, that binary: a real earlier
// release, e.g. git archive REV | tar -x -C DIR; go build ./cmd/tollgate)
// upgrades in place under recorded clientlib load: the raise is refused
// with FailedPrecondition naming a node that still runs the old build,
// after every upgrade but the last (with a real earlier release, sent to
// the upgraded nodes only: the old build has no such gate); once every node runs the new
// build the raise goes through and the moves finish, without a second
// rolling restart (each node serves the new groups in place). The callers see no error
// and no fail-open decision more than 2 s after a node stopped, and the
// recorded history checks.
func TestRollingUpgradeThenRaise(t *testing.T) {
	opts := clusterOptions{tenantMaxSeries: map[string]int64{"zd-0": 3000, "zd-1": 3000}}
	current := ""
	if prev := os.Getenv(previousBinEnv); prev != "" {
		current, opts.bin = tollgateBinary(t), prev
		t.Logf("the cluster starts on %s (%s), then upgrades to this build", prev, previousBinEnv)
	} else {
		t.Setenv(maxClusterVersionEnv, "5")
	}
	const limit = 3000
	limits := map[string]int{"zd-0": limit, "zd-1": limit}
	c := newCluster(t, opts)
	load := startRecordedLoad(t, c, 2, c.recordTracks(limits))
	defer load.close()
	loadFor(2 * time.Second)

	const to = 2 * groups
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// raiseAt sends the raise to a random node not named in skip.
	raiseAt := func(skip []string) error {
		actx, acancel := adminCtx(ctx, 10*time.Second)
		defer acancel()
		var targets []*node
		for _, n := range c.nodes {
			if !slices.Contains(skip, n.id) {
				targets = append(targets, n)
			}
		}
		_, err := c.admin(targets[rand.IntN(len(targets))]).RaiseGroups(actx, &api.RaiseGroupsRequest{To: to})
		return err
	}
	raise := func() error { return raiseAt(nil) }
	// refused wants the raise refused, naming one of old as the build
	// before this one, which supports a cluster version below 8
	// (Unavailable while a leader moves is retried).
	oldVersion := regexp.MustCompile(`(node-\d) supports cluster version ([1-7])\b`)
	simulated := current == ""
	refused := func(old []string) {
		t.Helper()
		for {
			var err error
			if simulated {
				err = raise()
			} else {
				err = raiseAt(old) // a real earlier release has no gate of its own
			}
			if err == nil {
				t.Fatalf("raise to %d accepted while %v run the build before online groups", to, old)
			}
			if status.Code(err) == codes.FailedPrecondition {
				if m := oldVersion.FindStringSubmatch(err.Error()); m != nil && slices.Contains(old, m[1]) {
					t.Logf("raise refused as expected: %v", status.Convert(err).Message())
					return
				}
				t.Fatalf("raise: %v; want it to name one of %v as supporting a cluster version below 8", err, old)
			}
			if ctx.Err() != nil {
				t.Fatalf("raise: %v, want FailedPrecondition", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var stops []time.Time
	roll := func(why string, each func(left []string)) {
		left := []string{"node-1", "node-2", "node-3"}
		for _, n := range c.nodes {
			t.Logf("SIGTERM %s (%s)", n.id, why)
			stops = append(stops, time.Now())
			n.term(t)
			n.restart(t)
			c.waitHealthy()
			left = slices.DeleteFunc(left, func(id string) bool { return id == n.id })
			each(left)
		}
	}
	// A real earlier release may support layout-raise already (cluster
	// version 6, 97ac923: it creates the groups, and only version 7 moves
	// partitions), so it accepts a raise sent to it or forwarded to it as
	// group 0's leader: with a real one, the refusals are checked on the
	// upgraded nodes, which refuse before forwarding (server.raiseGate).
	if simulated {
		refused([]string{"node-1", "node-2", "node-3"})
	}
	if err := os.Unsetenv(maxClusterVersionEnv); err != nil { // nodes started from here on run the new build
		t.Fatal(err)
	}
	if current != "" {
		c.bin = current
	}
	roll("upgrade", func(old []string) {
		if len(old) > 0 {
			refused(old)
		}
	})
	for {
		err := raise()
		if err == nil {
			break
		}
		if code := status.Code(err); (code != codes.FailedPrecondition && code != codes.Unavailable) || ctx.Err() != nil {
			t.Fatalf("raise after the upgrade: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // the gossiped versions catch up
	}
	for {
		pm := c.partitionMoves(ctx)
		if pm != nil && pm.GetPending() == 0 && pm.GetGroups() == to {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("moves not finished 5 minutes into the test: %+v", pm)
		}
		time.Sleep(200 * time.Millisecond)
	}
	loadFor(2 * time.Second)
	load.close()
	outside := load.failuresOutside(stops, 2*time.Second)
	t.Logf("load: %d requests; %d failures more than 2 s after a stop; %d Moved answers followed", load.requests.Load(), len(outside), load.cl.Stats().Moved)
	for i, f := range outside {
		if i == 5 {
			break
		}
		t.Errorf("a caller saw a failure at %s, not within 2 s of a stop: %s", f.at.Format("15:04:05.000"), f.what)
	}
	load.th.check()
	c.checkNoCrashes()
}

// partitionMoves is the coordinator's progress as the first node that
// answers Status reports it (nil when none does).
func (c *cluster) partitionMoves(ctx context.Context) *api.PartitionMovesStatus {
	for _, n := range c.nodes {
		actx, cancel := adminCtx(ctx, 5*time.Second)
		st, err := c.admin(n).Status(actx, &api.StatusRequest{})
		cancel()
		if err == nil && st.GetPartitionMoves() != nil {
			return st.GetPartitionMoves()
		}
	}
	return nil
}
