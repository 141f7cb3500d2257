package faulttest

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// cli runs the tollgate binary's operator command against the cluster's
// nodes, with the admin token, and returns its combined output.
func (c *cluster) cli(args ...string) (string, error) {
	args = append(args, "--addr", strings.Join(c.grpcAddrs(), ","), "--token", adminToken)
	out, err := exec.Command(c.bin, args...).CombinedOutput()
	return string(out), err
}

// deadVoters lists, for every group, the voters of its leader's configuration
// whose replica does not run on their (running) node: shut down, or unaware
// that it is a member. A replica reported "Shutdown" anywhere is listed too.
func (c *cluster) deadVoters() []string {
	var dead []string
	ngs := c.nodeGroups()
	byID := map[string]*node{}
	for _, n := range c.nodes {
		byID[n.id] = n
	}
	for g := range groups {
		for _, n := range c.nodes {
			if gs := groupState(ngs[n], g); gs != nil && gs.RaftState == "Shutdown" {
				dead = append(dead, fmt.Sprintf("group %d: %s's replica is shut down", g, n.id))
			}
		}
		l, _ := c.leaderOf(g)
		if l == nil {
			continue
		}
		peers, err := c.listPeers(l, g)
		if err != nil {
			continue
		}
		for _, v := range voters(peers) {
			n := byID[v]
			if n == nil || !n.usable() {
				continue
			}
			gs := groupState(ngs[n], g)
			if gs == nil {
				continue // did not answer this round
			}
			if gs.RaftState != "Leader" && gs.RaftState != "Follower" {
				dead = append(dead, fmt.Sprintf("group %d: voter %s's replica is %s", g, v, gs.RaftState))
			}
		}
	}
	return dead
}

// requireNoDeadVoters fails the test when a voter's replica does not run. A
// replica that is shut down fails at once (nothing brings it back); any other
// state (a candidate right after a leadership change) gets until the hang
// guard to settle.
func requireNoDeadVoters(t *testing.T, c *cluster, when string) {
	t.Helper()
	start := time.Now()
	for {
		dead := c.deadVoters()
		if len(dead) == 0 {
			return
		}
		shut := false
		for _, d := range dead {
			shut = shut || strings.Contains(d, "Shutdown") || strings.Contains(d, "shut down")
		}
		if shut || time.Since(start) > leaderTimeout {
			t.Fatalf("%s: voters without a running replica: %s", when, strings.Join(dead, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRemoveReAddLeader: under load, ten times: make a node the leader of
// group 1 (raft transfer-leadership), remove it (raft remove-server), add it
// back (raft add-voter), all through the CLI as an operator would. No voter
// may ever be left without a running replica, `tollgate status` must exit 0
// once the cluster settles, and afterwards killing any one node must leave
// every group with a leader.
func TestRemoveReAddLeader(t *testing.T) {
	opts := defaultClusterOptions()
	// No balancing: the node made leader must still lead when it is removed.
	opts.extraArgs = append(opts.extraArgs, "--leader-balance-interval", "-1s")
	c := newCluster(t, opts)
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	const g = 1
	handedOff := 0
	for cycle := 1; cycle <= 10; cycle++ {
		target := c.nodes[(cycle-1)%len(c.nodes)]
		// A transfer is best effort (another voter's timer may win): retry
		// until the target leads, as an operator would.
		start := time.Now()
		for {
			if l, _ := c.leaderOf(g); l == target {
				break
			}
			if time.Since(start) > leaderTimeout {
				t.Fatalf("cycle %d: %s never became leader of group %d", cycle, target.id, g)
			}
			if out, err := c.cli("raft", "transfer-leadership", "--group", fmt.Sprint(g), "--to", target.id); err != nil {
				t.Logf("cycle %d: transfer-leadership: %v\n%s", cycle, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		out, err := c.cli("raft", "remove-server", "--group", fmt.Sprint(g), "--id", target.id)
		if err != nil {
			t.Fatalf("cycle %d: remove-server %s (the leader): %v\n%s", cycle, target.id, err, out)
		}
		t.Logf("cycle %d: %s", cycle, strings.TrimSpace(out))
		if strings.Contains(out, "handed off") {
			handedOff++
		}
		waitVoters(t, c, g, 2)
		requireNoDeadVoters(t, c, fmt.Sprintf("cycle %d, after removing %s", cycle, target.id))
		if gs := groupState(c.nodeGroups()[target], g); gs == nil || gs.RaftState == "Shutdown" {
			t.Fatalf("cycle %d: the removed leader's replica of group %d: %v (must keep running to be added back)", cycle, g, gs)
		}
		ck.waitProgress(fmt.Sprintf("cycle %d: remove %s", cycle, target.id))

		out, err = c.cli("raft", "add-voter", "--group", fmt.Sprint(g), "--id", target.id)
		if err != nil {
			t.Fatalf("cycle %d: add-voter %s: %v\n%s", cycle, target.id, err, out)
		}
		t.Logf("cycle %d: %s", cycle, strings.TrimSpace(out))
		requireNoDeadVoters(t, c, fmt.Sprintf("cycle %d, after adding %s back", cycle, target.id))
		c.waitHealthy()
		if out, err := c.cli("status"); err != nil {
			t.Fatalf("cycle %d: status exits non-zero on a healthy cluster: %v\n%s", cycle, err, out)
		}
		ck.waitProgress(fmt.Sprintf("cycle %d: add %s", cycle, target.id))
	}
	// An election may move leadership between the check and the removal;
	// most removals must still have been of the leader.
	t.Logf("%d of 10 removals were of the leader (handed off first)", handedOff)
	if handedOff < 8 {
		t.Fatalf("only %d of 10 removals hit the leader: the leader path was not exercised", handedOff)
	}
	// Every voter runs: losing any one node keeps a quorum in every group.
	for _, n := range c.nodes {
		n.kill(t)
		for g := range groups {
			c.waitLeader(g, n)
		}
		ck.waitProgress("SIGKILL of " + n.id)
		n.restart(t)
		c.waitHealthy()
		ck.waitProgress("restart of " + n.id)
	}
	ck.finish()
}

// TestAddVoterDeadAddress: `raft add-voter` to an address nothing listens on
// (a closed port on 127.0.0.1) is refused with the reason, and no group's
// configuration changes: not for a new id, not for a member's id, not with
// --force. A member added at its real address afterwards becomes a voter
// through the learner path.
func TestAddVoterDeadAddress(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	closed := closedPort(t)
	type conf struct {
		index  uint64
		voters string
	}
	confs := func() []conf {
		var out []conf
		for g := range groups {
			l := c.waitLeader(g, nil)
			ctx, cancel := adminCtx(t.Context(), adminCallTO)
			resp, err := c.admin(l).ListPeers(ctx, &api.ListPeersRequest{Group: uint32(g)})
			cancel()
			if err != nil {
				t.Fatalf("group %d: list peers: %v", g, err)
			}
			var vs []string
			for _, p := range resp.Peers {
				vs = append(vs, p.Id+"="+p.Suffrage+"@"+p.Address)
			}
			out = append(out, conf{resp.ConfigurationIndex, strings.Join(vs, ",")})
		}
		return out
	}
	before := confs()
	for _, args := range [][]string{
		{"--group", "1", "--id", "node-9", "--address", closed},
		{"--group", "1", "--id", "node-2", "--address", closed},
		{"--all-groups", "--id", "node-9", "--address", closed, "--force"},
	} {
		out, err := c.cli(append([]string{"raft", "add-voter", "--catch-up-timeout", "3s"}, args...)...)
		if err == nil {
			t.Fatalf("add-voter %v to a closed port succeeded:\n%s", args, out)
		}
		if !strings.Contains(out, "does not answer raft") || !strings.Contains(out, "connection refused") || !strings.Contains(out, "nothing was changed") {
			t.Fatalf("add-voter %v: the refusal does not say why or that nothing changed:\n%s", args, out)
		}
		t.Logf("add-voter %v refused: %s", args, strings.TrimSpace(out))
		if after := confs(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("add-voter %v changed configurations:\nbefore %v\nafter  %v", args, before, after)
		}
	}
	c.waitHealthy()
	if out, err := c.cli("status"); err != nil {
		t.Fatalf("status after the refused add-voters: %v\n%s", err, out)
	}
}

// closedPort returns a 127.0.0.1 address where nothing listens and nothing
// can start listening while the test runs: a TCP socket bound to the port but
// never put in listen state, so connecting is refused (RST), and no other
// process (tests run beside other builds) can take the port meanwhile.
func closedPort(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
