package raftnode

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestSuccessorOrder(t *testing.T) {
	srv := func(id string, s raft.ServerSuffrage) raft.Server {
		return raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":1"), Suffrage: s}
	}
	three := []raft.Server{srv("c", raft.Voter), srv("a", raft.Voter), srv("x", raft.Nonvoter), srv("b", raft.Voter)}
	cases := []struct {
		g      int
		leader raft.ServerID
		want   raft.ServerID
	}{
		// group 0 ranks a, b, c; group 1 b, c, a; group 2 c, a, b; group 3 as 0.
		{0, "a", "b"}, {0, "b", "a"}, {0, "c", "a"}, {0, "", "a"},
		{1, "a", "b"}, {1, "b", "c"}, {1, "c", "b"},
		{2, "a", "c"}, {2, "b", "c"}, {2, "c", "a"},
		{3, "a", "b"}, {3, "b", "a"},
	}
	for _, c := range cases {
		got, ok := successorOf(c.g, three, map[raft.ServerID]bool{c.leader: true})
		if !ok || got.ID != c.want {
			t.Errorf("group %d, leader %q: successor %q (ok %v), want %q", c.g, c.leader, got.ID, ok, c.want)
		}
	}
	if s, ok := successorOf(1, three, map[raft.ServerID]bool{"b": true, "c": true}); !ok || s.ID != "a" {
		t.Errorf("group 1, b and c skipped: successor %q (ok %v), want a", s.ID, ok)
	}
	if s, ok := successorOf(0, three[:2], map[raft.ServerID]bool{"a": true}); ok {
		t.Errorf("two voters: successor %q, want none (a lone survivor has no quorum)", s.ID)
	}
	if s, ok := successorOf(0, []raft.Server{srv("a", raft.Voter), srv("b", raft.Nonvoter), srv("c", raft.Nonvoter)}, nil); ok {
		t.Errorf("one voter: successor %q, want none", s.ID)
	}
}

// clusterOf3 starts three real hosts on loopback with G groups and returns
// them once every group has a leader.
// Timers of 1 s (not 400 ms) keep a loaded machine, or the race detector,
// from turning scheduling stalls into extra elections that the tests would
// take for the tie-break's.
func clusterOf3(t *testing.T, G int) []*Host {
	t.Helper()
	hosts := make([]*Host, 3)
	for i := range hosts {
		cfg := Config{NodeID: "node-" + string(rune('a'+i)), DataDir: t.TempDir(), BindAddr: "127.0.0.1:0",
			Groups: G, NoSync: true, Logger: testLogger(t, slog.LevelWarn).With("node", i),
			HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: time.Second}
		hosts[i] = mustNew(t, cfg, newFSMs(G))
	}
	servers := make([]raft.Server, len(hosts))
	for i, h := range hosts {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
	}
	if err := hosts[0].BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		waitReady(t, h, 45*time.Second)
	}
	for g := range G {
		applyRetry(t, hosts, g, cmd(1), 30*time.Second)
	}
	return hosts
}

// makeLead transfers group g's leadership to h (from whichever host leads
// it) until h leads.
func makeLead(t *testing.T, hosts []*Host, g int, h *Host) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s leads group %d", h.NodeID(), g), func() bool {
		l := leaderOf(hosts, g)
		if l == h {
			return true
		}
		if l != nil {
			_ = l.Raft(g).LeadershipTransferToServer(h.NodeID(), h.Addr()).Error()
		}
		return false
	})
}

// leadAllCaughtUp makes hosts[0] lead groups 0 … G−1, commits an entry in
// each and waits until every other host has applied it (so any survivor can
// win an election); it returns each group's term then.
func leadAllCaughtUp(t *testing.T, hosts []*Host, G int) []uint64 {
	t.Helper()
	a := hosts[0]
	terms := make([]uint64, G)
	for g := range G {
		makeLead(t, hosts, g, a)
	}
	for g := range G {
		applyRetry(t, hosts, g, cmd(2), 30*time.Second)
		want := a.Raft(g).LastIndex()
		eventually(t, 30*time.Second, "followers caught up", func() bool {
			for _, h := range hosts[1:] {
				if h.Raft(g).AppliedIndex() < want {
					return false
				}
			}
			return true
		})
		terms[g] = a.Raft(g).CurrentTerm()
	}
	return terms
}

func leaderOf(hosts []*Host, g int) *Host {
	for _, h := range hosts {
		if h.Raft(g).State() == raft.Leader {
			return h
		}
	}
	return nil
}

// TestSuccessorWinsAfterLeaderDies: node-a leads all four groups of a real
// three-node cluster and is shut down. In every group the survivor ranked
// first (successorOf: rotated per group, so it is node-b in groups 0, 1 and 3
// and node-c in group 2) becomes leader, at the next term: one election
// round, no split vote. Without the tie-break each survivor campaigns on its
// own timer and either may win, sometimes after a split.
func TestSuccessorWinsAfterLeaderDies(t *testing.T) {
	const G = 4
	hosts := clusterOf3(t, G)
	a := hosts[0]
	// Every survivor holds the whole log, so the successor can win.
	terms := leadAllCaughtUp(t, hosts, G)
	conf := a.Raft(0).GetConfiguration()
	if err := conf.Error(); err != nil {
		t.Fatal(err)
	}
	servers := conf.Configuration().Servers
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	survivors := hosts[1:]
	for g := range G {
		succ, ok := successorOf(g, servers, map[raft.ServerID]bool{a.NodeID(): true})
		if !ok {
			t.Fatalf("group %d: no successor", g)
		}
		var l *Host
		eventually(t, 30*time.Second, "a new leader", func() bool { l = leaderOf(survivors, g); return l != nil })
		term := l.Raft(g).CurrentTerm()
		t.Logf("group %d: %s leads at term %d (was %d), successor %s", g, l.NodeID(), term, terms[g], succ.ID)
		if l.NodeID() != succ.ID {
			t.Errorf("group %d: %s won, want the successor %s", g, l.NodeID(), succ.ID)
		}
		if term != terms[g]+1 {
			t.Errorf("group %d: elected at term %d, want %d (one round)", g, term, terms[g]+1)
		}
	}
}

// TestSuccessorNudgeRefusedWhileLeaderHeard: a follower's TimeoutNow to
// the other follower, or to the leader, is refused while the leader is
// alive, and nothing changes (same leader, same term). So a follower that
// stalls and wakes with its heartbeat timer fired cannot start an election
// through its peer.
func TestSuccessorNudgeRefusedWhileLeaderHeard(t *testing.T) {
	hosts := clusterOf3(t, 1)
	l := leaderOf(hosts, 0)
	if l == nil {
		t.Fatal("no leader")
	}
	var f []*Host
	for _, h := range hosts {
		if h != l {
			f = append(f, h)
		}
	}
	term := l.Raft(0).CurrentTerm()
	from := f[0]
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(from.NodeID()), Addr: []byte(from.Addr())}
	for _, to := range []*Host{f[1], l} {
		var resp raft.TimeoutNowResponse
		err := from.group(0).trans.NetworkTransport.TimeoutNow(to.NodeID(), to.Addr(), &raft.TimeoutNowRequest{RPCHeader: header}, &resp)
		// Errors that crossed the transport come back as text.
		if err == nil || !strings.Contains(err.Error(), errNudgeRefused.Error()) {
			t.Errorf("TimeoutNow %s → %s with a live leader: %v, want refused", from.NodeID(), to.NodeID(), err)
		} else {
			t.Logf("TimeoutNow %s → %s: %v", from.NodeID(), to.NodeID(), err)
		}
	}
	time.Sleep(time.Second)
	if leaderOf(hosts, 0) != l || l.Raft(0).CurrentTerm() != term {
		t.Errorf("after refused nudges: leader %v at term %d, want %s at %d", leaderOf(hosts, 0), l.Raft(0).CurrentTerm(), l.NodeID(), term)
	}
}

// TestSuccessorBehindYields: the successor's log is behind the other
// survivor's (it was down while the leader committed entries with the
// third node), so it cannot win. The other survivor holds off for it, refuses
// its vote for the log, and then campaigns itself at once: it leads with
// every committed entry. Were the hold kept while the successor's vote
// requests keep arriving, the group would never elect.
func TestSuccessorBehindYields(t *testing.T) {
	hosts := clusterOf3(t, 1)
	a, b, c := hosts[0], hosts[1], hosts[2]
	// Group 0 ranks node-a, node-b, node-c: with node-a leading, node-b is
	// the successor.
	makeLead(t, hosts, 0, a)
	bCfg := b.cfg
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		applyRetry(t, []*Host{a}, 0, cmd(uint64(10+i)), 30*time.Second)
	}
	want := a.Raft(0).LastIndex()
	eventually(t, 30*time.Second, "node-c has the entries", func() bool { return c.Raft(0).LastIndex() >= want })
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// node-b again, on its old address and data dir, behind node-c.
	bCfg.BindAddr = string(b.Addr())
	b2 := mustNew(t, bCfg, newFSMs(1))
	var l *Host
	eventually(t, 60*time.Second, "a new leader", func() bool { l = leaderOf([]*Host{b2, c}, 0); return l != nil })
	if l != c {
		t.Fatalf("%s leads, want node-c (node-b's log is behind)", l.NodeID())
	}
	if got := c.Raft(0).LastIndex(); got < want {
		t.Errorf("node-c leads with last index %d, want ≥ %d", got, want)
	}
}
