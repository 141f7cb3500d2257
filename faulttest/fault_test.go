package faulttest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// loadFor lets the checker write for d between faults, so limits fill and
// acknowledged series pile up for re-sending.
func loadFor(d time.Duration) { time.Sleep(d) }

// TestLeaderKills: under load, five rounds of: SIGKILL the leader of a random
// group, wait for a new leader, check writes resume everywhere, restart the
// killed node (same flags and data dir), wait for health. Every attempt of
// the checker is recorded (history.jsonl) and the history checked for
// linearizability at the end.
func TestLeaderKills(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	loadFor(3 * time.Second)
	for round := 1; round <= 5; round++ {
		g := rand.IntN(groups)
		l := c.waitLeader(g, nil)
		t.Logf("round %d: killing %s, leader of group %d (leaders: %s)", round, l.id, g, c.describe())
		l.kill(t)
		nl := c.waitLeader(g, l)
		t.Logf("round %d: group %d now led by %s", round, g, nl.id)
		ck.waitProgress("SIGKILL of " + l.id)
		loadFor(time.Second)
		l.restart(t)
		c.waitHealthy()
		ck.waitProgress("restart of " + l.id)
		loadFor(2 * time.Second)
	}
	ck.finish()
}

// TestStopCont: SIGSTOP a node that leads at least one group for ~5 s under
// load; the other two must keep accepting writes for every group meanwhile,
// and the whole cluster afterwards. It runs --share-mode static (checked per
// group against the fixed split), the real-process fault test of that mode;
// the others run the default, movable.
func TestStopCont(t *testing.T) {
	opts, cfg := staticShares(defaultClusterOptions(), defaultCheckerConfig())
	c := newCluster(t, opts)
	ck := startChecker(t, c, cfg)
	ck.waitProgress("start")
	loadFor(3 * time.Second)
	for round := 1; round <= 2; round++ {
		var victim *node
		var led []int
		for g, l := range c.leaders() {
			if l != nil && (victim == nil || l == victim) {
				victim = l
				led = append(led, g)
			}
		}
		if victim == nil {
			t.Fatal("no group has a leader")
		}
		t.Logf("round %d: freezing %s, leader of groups %v", round, victim.id, led)
		stopAt := time.Now()
		victim.stop(t)
		ck.waitProgress("SIGSTOP of " + victim.id)
		if rest := 5*time.Second - time.Since(stopAt); rest > 0 {
			time.Sleep(rest)
		}
		victim.cont(t)
		t.Logf("round %d: %s was frozen for %v", round, victim.id, time.Since(stopAt).Round(time.Millisecond))
		c.waitHealthy()
		ck.waitProgress("SIGCONT of " + victim.id)
		loadFor(3 * time.Second)
	}
	ck.finish()
}

// TestMembershipChangesUnderLoad: under load, for a group: remove a non-leader
// voter, add it back (address from ListPeers), hand leadership to it, then let
// raft pick a leader; the group must end with 3 voters.
func TestMembershipChangesUnderLoad(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	loadFor(3 * time.Second)
	for round := 1; round <= 2; round++ {
		g := rand.IntN(groups)
		l := c.waitLeader(g, nil)
		victim := followerVoter(t, c, g, l)
		// Ask a node other than the leader: the call must be forwarded.
		via := c.nodes[(l.idx+1+rand.IntN(2))%3]

		t.Logf("round %d: group %d (leader %s): RemoveServer %s via %s", round, g, l.id, victim.Id, via.id)
		adminRetry(t, "RemoveServer", func(ctx context.Context) error {
			_, err := c.admin(via).RemoveServer(ctx, &api.RemoveServerRequest{Group: uint32(g), Id: victim.Id})
			return err
		})
		waitVoters(t, c, g, 2)
		ck.waitProgress("RemoveServer " + victim.Id)
		loadFor(2 * time.Second)

		t.Logf("round %d: group %d: AddVoter %s at %s", round, g, victim.Id, victim.Address)
		adminRetry(t, "AddVoter", func(ctx context.Context) error {
			_, err := c.admin(via).AddVoter(ctx, &api.AddVoterRequest{Group: uint32(g), Id: victim.Id, Address: victim.Address})
			return err
		})
		waitVoters(t, c, g, 3)
		ck.waitProgress("AddVoter " + victim.Id)
		c.waitHealthy()
		loadFor(2 * time.Second)

		t.Logf("round %d: group %d: TransferLeadership to %s", round, g, victim.Id)
		adminRetry(t, "TransferLeadership", func(ctx context.Context) error {
			resp, err := c.admin(via).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g), ToId: victim.Id})
			if err == nil {
				t.Logf("group %d: new leader %q", g, resp.NewLeaderId)
			}
			return err
		})
		ck.waitProgress("TransferLeadership to " + victim.Id)
		loadFor(2 * time.Second)

		t.Logf("round %d: group %d: TransferLeadership to any voter", round, g)
		adminRetry(t, "TransferLeadership", func(ctx context.Context) error {
			resp, err := c.admin(l).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g)})
			if err == nil {
				t.Logf("group %d: new leader %q", g, resp.NewLeaderId)
			}
			return err
		})
		ck.waitProgress("TransferLeadership to any")
		c.waitHealthy()
		loadFor(2 * time.Second)
	}
	for g := range groups {
		waitVoters(t, c, g, 3)
	}
	ck.finish()
}

// followerVoter returns a voter of group g other than its leader l.
func followerVoter(t *testing.T, c *cluster, g int, l *node) *api.Peer {
	t.Helper()
	peers, err := c.listPeers(l, g)
	if err != nil {
		t.Fatalf("ListPeers(%d): %v", g, err)
	}
	for _, p := range peers {
		if p.Suffrage == "Voter" && p.Id != l.id {
			return p
		}
	}
	t.Fatalf("group %d: no follower voter in %v", g, peers)
	return nil
}

// adminRetry calls an admin RPC until it succeeds, retrying the codes that
// mean "not now" (no leader reachable yet, leadership moving).
func adminRetry(t *testing.T, what string, call func(context.Context) error) {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := adminCtx(context.Background(), 20*time.Second)
		err := call(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Since(start) > leaderTimeout {
			t.Fatalf("%s: still failing after %v: %v", what, leaderTimeout, err)
		}
		t.Logf("%s: %v (retrying)", what, err)
		time.Sleep(500 * time.Millisecond)
	}
}

// waitVoters waits until group g's leader reports want voters.
func waitVoters(t *testing.T, c *cluster, g, want int) {
	t.Helper()
	start := time.Now()
	var last []string
	for time.Since(start) < healthyTimeout {
		if l, _ := c.leaderOf(g); l != nil {
			if peers, err := c.listPeers(l, g); err == nil {
				if last = voters(peers); len(last) == want {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("group %d: voters %v, want %d (after %v)", g, last, want, healthyTimeout)
}

// TestRollingRestart: SIGTERM each node in turn (graceful: it hands off its
// leaderships and leaves serf), check the other two keep accepting writes,
// restart it, wait for health.
func TestRollingRestart(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	loadFor(3 * time.Second)
	for _, n := range c.nodes {
		t.Logf("rolling restart: stopping %s (leaders: %s)", n.id, c.describe())
		n.term(t)
		ck.waitProgress("SIGTERM of " + n.id)
		loadFor(time.Second)
		n.restart(t)
		c.waitHealthy()
		ck.waitProgress("restart of " + n.id)
		loadFor(2 * time.Second)
	}
	ck.finish()
}
