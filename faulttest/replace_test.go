package faulttest

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestReplaceNodesAndZone runs the runbook's membership procedures
// (docs/operations.md) with the CLI, against real processes under load:
//
//  1. replace a node that lost its disk: node-3 is SIGKILLed and its data dir
//     deleted; `raft remove-server --id node-3 --all-groups`; node-4 starts
//     in zone-c with an empty data dir and --join, and the group leaders add
//     it (its zone has no voter);
//  2. move a zone: node-5 joins in zone-d, which has no voter, and the
//     group leaders add it (four voters); the groups node-4 leads are handed
//     off with `raft transfer-leadership`, `raft remove-server --id node-4
//     --all-groups`, node-4 stopped with SIGTERM;
//  3. add and remove a node by hand: node-6 joins zone-a, which has a voter,
//     and stays a spare; `raft add-voter --id node-6 --all-groups --force`; node-1 is
//     decommissioned as node-4 was.
//
// Every acknowledged series is still in the cluster at the end (a snapshot
// of it holds them all), and the checker sees no violation.
func TestReplaceNodesAndZone(t *testing.T) {
	opts := defaultClusterOptions()
	// The runbook's manual procedures, as an operator who places voters by
	// hand runs them: no automatic moves towards placement (TestScaleOutAndIn
	// covers those), so a spare stays a spare until it is added.
	opts.extraArgs = append(opts.extraArgs, "--move-interval", "-1s")
	c := newCluster(t, opts)
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	loadFor(3 * time.Second)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	cli := func(args ...string) string {
		t.Helper()
		out, err := c.tollgateCLI(2*time.Minute, append(args, "--addr", n1.grpcAddr+","+n2.grpcAddr)...)
		if err != nil {
			t.Fatalf("tollgate %s: %v", strings.Join(args, " "), err)
		}
		return out
	}

	// 1. node-3 loses its disk.
	n3.kill(t)
	if err := os.RemoveAll(n3.dir); err != nil {
		t.Fatal(err)
	}
	ck.waitProgress("loss of node-3")
	// Gossip needs a few seconds to call node-3 failed; until then a joining
	// node makes the group leaders place node-3 again (it still looks alive
	// in zone-c), so the runbook waits for `tollgate status` to show it.
	c.waitMemberNot(t, n1, n3.id, "alive")
	cli("raft", "remove-server", "--id", n3.id, "--all-groups")
	c.nodes = []*node{n1, n2}
	for g := range groups {
		c.waitVotersExactly(t, g, []string{n1.id, n2.id})
	}
	n4 := c.newJoiningNode(n1, "node-4", "zone-c", n1)
	c.nodes = append(c.nodes, n4)
	n4.startAndWait(t)
	c.waitPlaced(t, n4, []string{n1.id, n2.id, n4.id}, n1)
	c.waitHealthy()
	ck.waitProgress("node-4 replaced node-3")
	loadFor(2 * time.Second)

	// 2. zone-c moves to zone-d: node-5 joins in zone-d, which has no voter,
	// so the group leaders add it; node-4 hands off, is removed and stopped.
	n5 := c.newJoiningNode(n1, "node-5", "zone-d", n1)
	n5.startAndWait(t)
	c.nodes = append(c.nodes, n5)
	c.waitPlaced(t, n5, []string{n1.id, n2.id, n4.id, n5.id}, n1)
	ck.waitProgress("node-5 joined zone-d")
	decommission(t, c, n4, cli)
	for g := range groups {
		c.waitVotersExactly(t, g, []string{n1.id, n2.id, n5.id})
	}
	c.nodes = []*node{n1, n2, n5}
	c.waitHealthy()
	ck.waitProgress("zone-c moved to zone-d")
	loadFor(2 * time.Second)

	// 3. A second node in zone-a stays a spare until added by hand; then it
	// takes node-1's place.
	n6 := c.newJoiningNode(n1, "node-6", "zone-a", n2)
	n6.startAndWait(t)
	loadFor(3 * time.Second)
	for g := range groups {
		c.waitVotersExactly(t, g, []string{n1.id, n2.id, n5.id})
	}
	cli("raft", "add-voter", "--id", n6.id, "--all-groups", "--force") // zone-a has node-1 until it is decommissioned
	c.nodes = append(c.nodes, n6)
	for g := range groups {
		c.waitVotersExactly(t, g, []string{n1.id, n2.id, n5.id, n6.id})
	}
	ck.waitProgress("node-6 added")
	decommission(t, c, n1, func(args ...string) string {
		t.Helper()
		out, err := c.tollgateCLI(2*time.Minute, append(args, "--addr", n2.grpcAddr)...)
		if err != nil {
			t.Fatalf("tollgate %s: %v", strings.Join(args, " "), err)
		}
		return out
	})
	for g := range groups {
		c.waitVotersExactly(t, g, []string{n2.id, n5.id, n6.id})
	}
	c.nodes = []*node{n2, n5, n6}
	c.waitHealthy()
	ck.waitProgress("node-6 replaced node-1")
	loadFor(2 * time.Second)
	n1 = n2
	cli("status") // exits non-zero when a group has no leader or a replica is halted

	ck.finish()
	acked := ck.AckedHashes()
	if ex, missing, checked := missingSeries(acked, c.seriesIn(t, n1)); missing > 0 {
		t.Fatalf("%d of %d acknowledged series missing after the replacements, e.g. %s", missing, checked, strings.Join(ex, ", "))
	} else {
		t.Logf("all %d acknowledged series present after the replacements", checked)
	}
}

// decommission removes a running node the runbook's way: the groups it leads
// are handed to other voters, it is removed from every group, then stopped
// with SIGTERM.
func decommission(t *testing.T, c *cluster, n *node, cli func(args ...string) string) {
	t.Helper()
	for g := range groups {
		if l, _ := c.leaderOf(g); l == n {
			c.transferLeadership(t, g, nil, l)
		}
	}
	cli("raft", "remove-server", "--id", n.id, "--all-groups")
	n.term(t)
}
