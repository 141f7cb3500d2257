package netpart

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/checker"
)

// probeBound only catches hangs: the figures are logged, not asserted.
const probeBound = 30 * time.Second

func loadFor(d time.Duration) { time.Sleep(d) }

// partitionRounds is how many leaders TestIsolateLeader cuts off:
// $TOLLGATE_PARTITIONS, or 3 so that CI exercises it quickly.
func partitionRounds(t *testing.T) int {
	v := os.Getenv("TOLLGATE_PARTITIONS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("TOLLGATE_PARTITIONS=%q: want a positive integer", v)
	}
	return n
}

// TestIsolateLeader (scenario a): under load on every group, cut the leader
// of a group off from both peers (it still answers clients). The checker
// fails the test if the cut-off node acknowledges a new series for any request sent after the
// cut; clients must get their next acknowledged write from another node. The
// cut holds for a few seconds past the old leader's step-down, then heals.
// Each round logs: leader isolated → next acknowledged write to its group
// (from another node), → the old leader stepped down, heal → healthy, and
// the longest write gap after the heal.
//
//	TOLLGATE_PARTITIONS=12 go test -count=1 -run TestIsolateLeader -v ./faulttest/netpart/
func TestIsolateLeader(t *testing.T) {
	rounds := partitionRounds(t)
	c := newCluster(t)
	ck := startChecker(t, c, checkerConfig())
	ck.WaitProgress("start")
	loadFor(2 * time.Second)

	type result struct {
		node              string
		group             int
		led               []int
		write, stepDown   time.Duration // from the cut
		healthy, maxGap   time.Duration // from the heal
		newLeader, gapGrp string
	}
	var results []result
	for round := 1; round <= rounds; round++ {
		g := (round - 1) % groups
		ngs := c.nodeGroups()
		l, _ := c.leaderOf(g, ngs)
		if l == nil {
			t.Fatalf("round %d: group %d has no leader (%s)", round, g, c.Describe())
		}
		r := result{node: l.id, group: g, led: leads(ngs[l])}
		cutAt := c.isolate(l)
		lift := ck.ForbidAcks(l.grpcAdv, cutAt, "it was cut off from its peers")
		stepped := c.watchStepDown(l, cutAt)
		pr := ck.AddProbe(g, cutAt, l.grpcAdv)
		select {
		case <-pr.Done:
			r.write, r.newLeader = pr.At.Sub(cutAt), c.byAdv(pr.Node).String()
		case <-time.After(probeBound):
			ck.DropProbe(pr)
			t.Fatalf("round %d: no write to group %d acknowledged by another node within %v of cutting off %s; leaders: %s; errors: %s",
				round, g, probeBound, l.id, c.Describe(), ck.ErrSummary())
		}
		if r.stepDown = <-stepped; r.stepDown < 0 {
			t.Fatalf("round %d: %s, cut off from its peers, still calls itself leader after %v", round, l.id, stepDownTimeout)
		}
		ck.WaitProgress("isolation of " + l.id)
		// Hold the cut: the forbid stays on while the old leader keeps being
		// asked (it is still reachable by clients).
		if rest := 3*time.Second - time.Since(cutAt); rest > 0 {
			time.Sleep(rest)
		}
		healAt := c.rejoin(l)
		lift()
		r.healthy = c.waitHealthy()
		ck.WaitProgress("heal of " + l.id)
		loadFor(time.Second)
		for gg := range groups {
			if gap, _ := ck.MaxGap(gg, healAt, time.Now()); gap > r.maxGap {
				r.maxGap, r.gapGrp = gap, fmt.Sprint(gg)
			}
		}
		results = append(results, r)
		t.Logf("round %d/%d: cut off %s (leader of groups %v); group %d: next write acknowledged after %.2f s by %s; old leader stepped down after %.2f s; healed: healthy after %.2f s, longest write gap after heal %.2f s (group %s)",
			round, rounds, l.id, r.led, g, r.write.Seconds(), r.newLeader, r.stepDown.Seconds(), r.healthy.Seconds(), r.maxGap.Seconds(), r.gapGrp)
	}

	var writes, steps, heals []time.Duration
	for _, r := range results {
		writes, steps, heals = append(writes, r.write), append(steps, r.stepDown), append(heals, r.healthy)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "leader isolated (docker network disconnect of its peers network) → next acknowledged write to its group, %d partitions\n", len(results))
	fmt.Fprintf(&b, "| | median | max | min |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| leader isolated → next acknowledged write | **%s** | **%s** | %s |\n", fmtDur(median(writes)), fmtDur(slices.Max(writes)), fmtDur(slices.Min(writes)))
	fmt.Fprintf(&b, "| leader isolated → old leader stepped down | %s | %s | %s |\n", fmtDur(median(steps)), fmtDur(slices.Max(steps)), fmtDur(slices.Min(steps)))
	fmt.Fprintf(&b, "| heal → every group led, 3 voters | %s | %s | %s |\n", fmtDur(median(heals)), fmtDur(slices.Max(heals)), fmtDur(slices.Min(heals)))
	t.Logf("\n%s", b.String())
	ck.finish()
}

// TestPartitionFollower (scenario b): hand every leadership off one node,
// then cut it off its peers for 5 s. The other two hold a quorum of every
// group: writes go on everywhere, and the cut-off follower acknowledges
// nothing. After the heal it catches up (applied index = the leader's).
func TestPartitionFollower(t *testing.T) {
	c := newCluster(t)
	ck := startChecker(t, c, checkerConfig())
	ck.WaitProgress("start")
	loadFor(2 * time.Second)

	f := c.nodes[1]
	for g := range groups {
		l, _ := c.leaderOf(g, c.nodeGroups())
		if l != f {
			continue
		}
		ctx, cancel := adminCtx(context.Background())
		resp, err := c.admin(f).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g)})
		cancel()
		if err != nil {
			t.Fatalf("TransferLeadership of group %d off %s: %v", g, f.id, err)
		}
		t.Logf("group %d: leadership handed from %s to %s", g, f.id, resp.NewLeaderId)
	}
	// The leader balancer may hand a group back between the transfer and the
	// cut; then this round also covers a leader cut, and says so.
	cutAt := c.isolate(f)
	lift := ck.ForbidAcks(f.grpcAdv, cutAt, "it was cut off from its peers")
	if led := leads(c.nodeGroups()[f]); len(led) > 0 {
		t.Logf("note: %s led groups %v again when it was cut off (leader balancing)", f.id, led)
	} else {
		t.Logf("cut off follower %s (leads nothing)", f.id)
	}
	ck.WaitProgress("partition of follower " + f.id)
	loadFor(5*time.Second - time.Since(cutAt))
	ck.logGaps("while "+f.id+" was cut off", cutAt, time.Now())
	healAt := c.rejoin(f)
	lift()
	healthy := c.waitHealthy()
	caught := c.waitCaughtUp(f, healAt)
	ck.WaitProgress("heal of " + f.id)
	t.Logf("healed %s: cluster healthy after %.2f s, its applied index reached the leaders' after %.2f s", f.id, healthy.Seconds(), caught.Seconds())
	loadFor(time.Second)
	ck.logGaps("after the heal", healAt, time.Now())
	ck.finish()
}

// TestZonePartition (scenario c): cut zone-c's node off both networks (no
// peer and no client reaches it) for 8 s, then heal. Groups it led elect a
// leader in the other zones; afterwards every group is led again, with 3
// voters, and the writes go on.
func TestZonePartition(t *testing.T) {
	c := newCluster(t)
	ck := startChecker(t, c, checkerConfig())
	ck.WaitProgress("start")
	loadFor(2 * time.Second)

	z := c.nodes[2]
	led := leads(c.nodeGroups()[z])
	cutAt := c.cutZone(z)
	var firsts []string
	var prs []*checker.Probe
	for _, g := range led { // all registered before waiting: each resolves at its group's first ack
		prs = append(prs, ck.AddProbe(g, cutAt, z.grpcAdv))
	}
	for _, pr := range prs {
		select {
		case <-pr.Done:
			firsts = append(firsts, fmt.Sprintf("group %d after %.2f s", pr.G, pr.At.Sub(cutAt).Seconds()))
		case <-time.After(probeBound):
			ck.DropProbe(pr)
			t.Fatalf("group %d: no write acknowledged within %v of cutting off %s; errors: %s", pr.G, probeBound, z.zone, ck.ErrSummary())
		}
	}
	t.Logf("cut off %s (%s, leader of groups %v): next acknowledged writes: %s", z.zone, z.id, led, strings.Join(firsts, ", "))
	ck.WaitProgress("partition of " + z.zone)
	loadFor(8*time.Second - time.Since(cutAt))
	ck.logGaps("while "+z.zone+" was cut off", cutAt, time.Now())
	healAt := c.healZone(z)
	healthy := c.waitHealthy()
	caught := c.waitCaughtUp(z, healAt)
	ck.WaitProgress("heal of " + z.zone)
	t.Logf("healed %s: every group led with 3 voters after %.2f s, %s caught up after %.2f s", z.zone, healthy.Seconds(), z.id, caught.Seconds())
	// The leader balancer hands a group back to the healed node once gossip
	// sees it alive again (every ~10 s): watch for that hand-off and for
	// the write gap it causes, which a client sees as a pause after the heal.
	changes := c.watchLeaders(healAt.Add(18*time.Second), 2)
	for _, ch := range changes {
		gap, end := ck.MaxGap(ch.g, ch.at.Add(-time.Second), ch.at.Add(2*time.Second))
		t.Logf("after the heal: group %d leader %s → %s at +%.2f s; longest write gap of group %d around it %.2f s (ended +%.2f s)",
			ch.g, ch.from, ch.to, ch.at.Sub(healAt).Seconds(), ch.g, gap.Seconds(), end.Sub(healAt).Seconds())
	}
	if len(changes) == 0 {
		t.Logf("after the heal: no leadership change within %.0f s", time.Since(healAt).Seconds())
	}
	ck.logGaps("after the heal", healAt, time.Now())
	ck.finish()
}

// TestFlapLink (scenario d): node-1's link to its peers goes down and up
// eight times, 0.3–2 s each way, whatever it leads at the time. While the
// link is down the node must acknowledge no new series; at the end every group is
// led again and every acknowledged series is still accepted.
func TestFlapLink(t *testing.T) {
	c := newCluster(t)
	ck := startChecker(t, c, checkerConfig())
	ck.WaitProgress("start")
	loadFor(2 * time.Second)

	n := c.nodes[0]
	downs := []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond, 700 * time.Millisecond, 2 * time.Second,
		400 * time.Millisecond, 1200 * time.Millisecond, 300 * time.Millisecond, 1800 * time.Millisecond}
	ups := []time.Duration{1 * time.Second, 300 * time.Millisecond, 2 * time.Second, 500 * time.Millisecond,
		1500 * time.Millisecond, 300 * time.Millisecond, 800 * time.Millisecond, 0}
	start := time.Now()
	for i := range downs {
		led := leads(c.nodeGroups()[n])
		cutAt := c.isolate(n)
		lift := ck.ForbidAcks(n.grpcAdv, cutAt, fmt.Sprintf("flap %d cut it off", i+1))
		time.Sleep(downs[i])
		c.rejoin(n)
		lift()
		t.Logf("flap %d: %s (leading %v) down %v, then up %v", i+1, n.id, led, downs[i], ups[i])
		time.Sleep(ups[i])
	}
	end := time.Now()
	healthy := c.waitHealthy()
	t.Logf("after %d flaps: healthy %.2f s after the last heal", len(downs), healthy.Seconds())
	ck.WaitProgress("link flapping")
	ck.logGaps("during the flapping", start, end)
	ck.finish()
}

type leaderChange struct {
	g        int
	from, to string
	at       time.Time
}

// watchLeaders polls every group's leader until `until`, or until max
// changes were seen, and returns the changes.
func (c *cluster) watchLeaders(until time.Time, max int) []leaderChange {
	cur := make([]string, groups)
	var out []leaderChange
	first := true
	for time.Now().Before(until) && len(out) < max {
		ngs := c.nodeGroups()
		now := time.Now()
		for g := range groups {
			id := "-"
			if l, _ := c.leaderOf(g, ngs); l != nil {
				id = l.id
			}
			if !first && id != cur[g] {
				out = append(out, leaderChange{g: g, from: cur[g], to: id, at: now})
			}
			cur[g] = id
		}
		first = false
		time.Sleep(50 * time.Millisecond)
	}
	return out
}

// waitCaughtUp waits until n's applied index of every group reaches the
// commit index its leader reported at the start of the wait.
func (c *cluster) waitCaughtUp(n *node, since time.Time) time.Duration {
	c.t.Helper()
	ngs := c.nodeGroups()
	target := map[int]uint64{}
	for g := range groups {
		if l, _ := c.leaderOf(g, ngs); l != nil {
			target[g] = groupState(ngs[l], g).CommitIndex
		}
	}
	for time.Since(since) < healthyTimeout {
		ctx, cancel := adminCtx(context.Background())
		ng, err := c.admin(n).NodeGroups(ctx, &api.NodeGroupsRequest{})
		cancel()
		if err == nil {
			behind := false
			for g, idx := range target {
				if gs := groupState(ng, g); gs == nil || gs.AppliedIndex < idx {
					behind = true
				}
			}
			if !behind {
				return time.Since(since)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("%s did not catch up within %v", n.id, healthyTimeout)
	return 0
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
