package faulttest

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// TestRaiseMovesThroughKills is the fault bar of raising the group count
// online: a 3-node cluster of real processes, under recorded clientlib load
// whose tenants reach their limits, raises its group count from G to 2G.
// Every node is SIGKILLed and restarted in turn (a node leads the groups a
// raise added from its next start). While group 0's leader then moves the
// partitions (each step slowed by TOLLGATE_TEST_MOVE_STEP_PAUSE so that the
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
	// The rolling restart, by SIGKILL.
	for _, n := range c.nodes {
		kill(n, "rolling restart after the raise")
	}
	status := func() *api.PartitionMovesStatus {
		for _, n := range c.nodes {
			actx, acancel := adminCtx(ctx, 5*time.Second)
			st, err := c.admin(n).Status(actx, &api.StatusRequest{})
			acancel()
			if err == nil && st.GetPartitionMoves() != nil {
				return st.GetPartitionMoves()
			}
		}
		return nil
	}
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
