package raftnode

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// slowTimers gives h's groups heartbeat and election timeouts of d, so that
// any election within d was not started by raft's own timer.
func slowTimers(t *testing.T, h *Host, d time.Duration) {
	t.Helper()
	for g := range h.Groups() {
		r := h.Raft(g)
		rc := r.ReloadableConfig()
		rc.HeartbeatTimeout, rc.ElectionTimeout = d, d
		if err := r.ReloadConfig(rc); err != nil {
			t.Fatal(err)
		}
	}
}

// crash stops h as a killed process does: its raft port stops accepting
// first, then every connection it holds ends, and only then does its raft
// stop (it sends nothing in between: its peers see no transfer).
func crash(t *testing.T, h *Host) {
	t.Helper()
	if err := h.mux.Close(); err != nil {
		t.Fatal(err)
	}
	_ = h.Shutdown()
}

// slowSurvivors sets the survivors' raft timers to slow, so that only the
// dead-leader probe can elect within a test, and returns group 0's servers
// as a (the leader about to crash) sees them.
func slowSurvivors(t *testing.T, a *Host, survivors []*Host, slow time.Duration) []raft.Server {
	t.Helper()
	for _, h := range survivors {
		slowTimers(t, h, slow)
	}
	conf := a.Raft(0).GetConfiguration()
	if err := conf.Error(); err != nil {
		t.Fatal(err)
	}
	return conf.Configuration().Servers
}

// TestDeadLeaderFoundByRefusedConnection: node-a leads three groups and
// crashes. The survivors' raft timers are set to 60 s, so raft alone would
// elect no one for a minute; each group's successor is leader at the next
// term (one round) well before that, because the ended connections led the
// survivors to node-a's port, which refused them.
func TestDeadLeaderFoundByRefusedConnection(t *testing.T) {
	const G = 3
	hosts := clusterOf3(t, G)
	a := hosts[0]
	terms := leadAllCaughtUp(t, hosts, G)
	const slow = time.Minute
	survivors := hosts[1:]
	servers := slowSurvivors(t, a, survivors, slow)
	crashed := time.Now()
	crash(t, a)
	for g := range G {
		succ, ok := successorOf(g, servers, map[raft.ServerID]bool{a.NodeID(): true})
		if !ok {
			t.Fatalf("group %d: no successor", g)
		}
		var l *Host
		// Well inside the survivors' 60 s timers: only the refused
		// connection can have started this election.
		eventually(t, slow/3, "a new leader", func() bool { l = leaderOf(survivors, g); return l != nil })
		term := l.Raft(g).CurrentTerm()
		t.Logf("group %d: %s leads at term %d (was %d) %v after the crash; successor %s", g, l.NodeID(), term, terms[g],
			time.Since(crashed).Round(time.Millisecond), succ.ID)
		if l.NodeID() != succ.ID {
			t.Errorf("group %d: %s won, want the successor %s", g, l.NodeID(), succ.ID)
		}
		if term != terms[g]+1 {
			t.Errorf("group %d: elected at term %d, want %d (one round)", g, term, terms[g]+1)
		}
	}
	var campaigns uint64
	for _, h := range survivors {
		st := h.LeaderDownStats()
		t.Logf("%s: %+v", h.NodeID(), st)
		if st.Refused == 0 {
			t.Errorf("%s: no probe of the dead leader was refused: %+v", h.NodeID(), st)
		}
		campaigns += st.Campaigns
	}
	if campaigns != G {
		t.Errorf("%d elections started by the survivors on a refused connection, want %d (one per group)", campaigns, G)
	}
	// The groups work under their new leaders.
	for g := range G {
		applyRetry(t, survivors, g, cmd(3), 30*time.Second)
	}
}

// TestDeadLeaderSuccessorSilent: node-a leads two groups and crashes, and
// each group's successor fails to campaign (campaignFaultForTest, as a
// voter that does not know the configuration yet does). The survivors'
// timers are 60 s,
// so raft would elect no one for a minute; the other survivor, holding off
// for the successor, campaigns itself once deadLeaderHold passes with no
// leader, and wins (the successor's log is as long as its own).
func TestDeadLeaderSuccessorSilent(t *testing.T) {
	const G = 2
	hosts := clusterOf3(t, G)
	a := hosts[0]
	leadAllCaughtUp(t, hosts, G)
	const slow = time.Minute
	survivors := hosts[1:]
	servers := slowSurvivors(t, a, survivors, slow)
	silent := func(g int, self raft.ServerID) bool {
		succ, _ := successorOf(g, servers, map[raft.ServerID]bool{a.NodeID(): true})
		return self == succ.ID
	}
	campaignFaultForTest.Store(&silent)
	t.Cleanup(func() { campaignFaultForTest.Store(nil) })
	crashed := time.Now()
	crash(t, a)
	for g := range G {
		succ, _ := successorOf(g, servers, map[raft.ServerID]bool{a.NodeID(): true})
		var l *Host
		eventually(t, slow/3, "a new leader", func() bool { l = leaderOf(survivors, g); return l != nil })
		t.Logf("group %d: %s leads %v after the crash; the silent successor was %s", g, l.NodeID(), time.Since(crashed).Round(time.Millisecond), succ.ID)
		if l.NodeID() == succ.ID {
			t.Errorf("group %d: the successor %s leads, want the other survivor (the successor never campaigned)", g, succ.ID)
		}
	}
	var heldOut uint64
	for _, h := range survivors {
		heldOut += h.LeaderDownStats().HeldOut
	}
	if heldOut != G {
		t.Errorf("%d elections started after holding off, want %d (one per group)", heldOut, G)
	}
	campaignFaultForTest.Store(nil)
	for g := range G {
		applyRetry(t, survivors, g, cmd(3), 30*time.Second)
	}
}

// TestLiveLeaderConnectionsEndNoElection: every raft connection of a live
// leader ends (as when its pool drops them, or a middlebox resets them).
// The followers probe its port, find it answering, and nothing changes: the
// same leader at the same term, and the group keeps committing.
func TestLiveLeaderConnectionsEndNoElection(t *testing.T) {
	hosts := clusterOf3(t, 1)
	l := leaderOf(hosts, 0)
	if l == nil {
		t.Fatal("no leader")
	}
	term := l.Raft(0).CurrentTerm()
	var followers []*Host
	for _, h := range hosts {
		if h != l {
			followers = append(followers, h)
		}
	}
	layer := l.group(0).layer
	layer.mu.Lock()
	conns := make([]*trackedConn, 0, len(layer.conns))
	for c := range layer.conns {
		conns = append(conns, c)
	}
	layer.mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("the leader holds no raft connections")
	}
	for _, c := range conns {
		_ = c.Close()
	}
	eventually(t, 30*time.Second, "a follower probed the leader's port", func() bool {
		for _, h := range followers {
			if h.LeaderDownStats().Probes > 0 {
				return true
			}
		}
		return false
	})
	applyRetry(t, hosts, 0, cmd(5), 30*time.Second)
	// A probe in flight when the command committed has had its three
	// attempts (about 100 ms) by the time a second one commits.
	time.Sleep(300 * time.Millisecond)
	applyRetry(t, hosts, 0, cmd(6), 30*time.Second)
	for _, h := range followers {
		if st := h.LeaderDownStats(); st.Refused != 0 || st.Campaigns != 0 {
			t.Errorf("%s: a live leader was taken for dead: %+v", h.NodeID(), st)
		}
	}
	if now := leaderOf(hosts, 0); now != l {
		t.Errorf("the leader changed from %s", l.NodeID())
	}
	if got := l.Raft(0).CurrentTerm(); got != term {
		t.Errorf("term %d, want %d (no election)", got, term)
	}
}

// TestDownProbe: a closed port is refused (and counted); an open one is
// not; a second question within probeReuse gets a refusal again without a
// new probe, while an answering port is probed again.
func TestDownProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := closed.Addr().String()
	_ = closed.Close()

	p := newDownProbe()
	ctx := context.Background()
	if p.isRefused(ctx, raft.ServerAddress(ln.Addr().String())) {
		t.Error("an open port was found refusing")
	}
	if !p.isRefused(ctx, raft.ServerAddress(deadAddr)) {
		t.Error("a closed port was not found refusing")
	}
	made := p.made.Load()
	if !p.isRefused(ctx, raft.ServerAddress(deadAddr)) {
		t.Error("the reused answer changed")
	}
	if got := p.made.Load(); got != made {
		t.Errorf("%d probes after a reused answer, want %d", got, made)
	}
	before := p.made.Load()
	if p.isRefused(ctx, raft.ServerAddress(ln.Addr().String())) {
		t.Error("an open port was found refusing")
	}
	if got := p.made.Load(); got != before+1 {
		t.Errorf("an answering port's probe was reused (%d probes, want %d): a port can close a moment later", got, before+1)
	}
	if p.refused.Load() != 1 {
		t.Errorf("refused = %d, want 1", p.refused.Load())
	}
	// A dial error other than a refusal (here: a timeout) is no evidence.
	p2 := newDownProbe()
	p2.dial = func(ctx context.Context, endpoint string) error {
		return &net.OpError{Op: "dial", Err: errors.New("i/o timeout")}
	}
	if p2.isRefused(ctx, "127.0.0.1:1") {
		t.Error("a timeout was taken as a refusal")
	}
	p3 := newDownProbe()
	p3.dial = func(ctx context.Context, endpoint string) error {
		return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
	}
	if !p3.isRefused(ctx, "127.0.0.1:1/inc") {
		t.Error("a refusal (address with an incarnation) was not recognised")
	}
}

// TestDeadLeaderSuccessorBehind: the successor (node-b) of a leader found
// dead has a shorter log than the other survivor (node-c), so node-c
// refuses its vote; node-c, holding off for the successor since its own
// probe was refused, campaigns at once and wins (the log shows how soon;
// timers are a minute, so raft's own election cannot be the one seen).
func TestDeadLeaderSuccessorBehind(t *testing.T) {
	hosts := clusterOf3(t, 1)
	a, b, c := hosts[0], hosts[1], hosts[2]
	// node-b must hold the configuration before its appends are refused:
	// a follower with an empty log knows no peers, computes no successor
	// and cannot campaign (that was the rare "race" of this test: 3 runs in
	// 40 under -race, where node-c then won only by deadLeaderHold).
	leadAllCaughtUp(t, hosts, 1)
	if s, _ := successorOf(0, a.Raft(0).GetConfiguration().Configuration().Servers, map[raft.ServerID]bool{a.NodeID(): true}); s.ID != b.NodeID() {
		t.Fatalf("successor %s, want node-b", s.ID)
	}
	behind := func(_ int, self raft.ServerID) bool { return self == b.NodeID() }
	appendFaultForTest.Store(&behind)
	t.Cleanup(func() { appendFaultForTest.Store(nil) })
	for i := range 3 {
		applyRetry(t, []*Host{a}, 0, cmd(uint64(20+i)), 30*time.Second)
	}
	want := a.Raft(0).LastIndex()
	eventually(t, 30*time.Second, "node-c has the entries", func() bool { return c.Raft(0).LastIndex() >= want })
	if got := b.Raft(0).LastIndex(); got >= want {
		t.Fatalf("node-b's last index %d, want < %d (behind)", got, want)
	}
	if _, l := b.Raft(0).LeaderWithID(); l != a.NodeID() {
		t.Fatalf("node-b follows %q, want node-a", l)
	}
	term := a.Raft(0).CurrentTerm()
	crashBehind(t, a, b, c)
	t.Logf("node-c leads at term %d (was %d); node-b %+v, node-c %+v", c.Raft(0).CurrentTerm(), term, b.LeaderDownStats(), c.LeaderDownStats())
	if got := c.Raft(0).LastIndex(); got < want {
		t.Errorf("node-c leads with last index %d, want ≥ %d", got, want)
	}
	appendFaultForTest.Store(nil)
	applyRetry(t, []*Host{b, c}, 0, cmd(30), 30*time.Second)
}

// TestElectionOverStaleConnection: node-c led once, so its transport pools
// connections to node-b; node-b then restarts, which leaves those
// connections dead in node-c's pool. When node-a (the leader) crashes with
// node-b's log behind, node-c refuses node-b's vote and asks node-b for its
// own vote over a pooled connection: the first send finds it ended (EOF), is
// re-sent on a new one, and node-c wins in that round (the log shows how
// soon; without the re-send the round waits out the 3-s election timeout;
// TestRetryStale checks the re-send itself).
func TestElectionOverStaleConnection(t *testing.T) {
	hosts := clusterOf3(t, 1)
	a, b, c := hosts[0], hosts[1], hosts[2]
	makeLead(t, hosts, 0, c)
	applyRetry(t, hosts, 0, cmd(40), 30*time.Second) // node-c's pool now holds connections to node-b
	makeLead(t, hosts, 0, a)
	bCfg := b.cfg
	bCfg.BindAddr = string(b.Addr())
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	b = mustNew(t, bCfg, newFSMs(1))
	hosts[1] = b
	applyRetry(t, hosts, 0, cmd(41), 30*time.Second)
	want := a.Raft(0).LastIndex()
	eventually(t, 30*time.Second, "node-b caught up", func() bool { return b.Raft(0).LastIndex() >= want })
	eventually(t, 30*time.Second, "node-b follows node-a", func() bool { _, l := b.Raft(0).LeaderWithID(); return l == a.NodeID() })

	behind := func(_ int, self raft.ServerID) bool { return self == b.NodeID() }
	appendFaultForTest.Store(&behind)
	t.Cleanup(func() { appendFaultForTest.Store(nil) })
	applyRetry(t, []*Host{a}, 0, cmd(42), 30*time.Second)
	want = a.Raft(0).LastIndex()
	eventually(t, 30*time.Second, "node-c has the entry", func() bool { return c.Raft(0).LastIndex() >= want })
	crashBehind(t, a, b, c)
	appendFaultForTest.Store(nil)
	applyRetry(t, []*Host{b, c}, 0, cmd(43), 30*time.Second)
}

// crashBehind crashes a (group 0's leader) while b's log is behind c's,
// and wants c to lead group 0 after it. The survivors' timers are a minute,
// so only the dead-leader probe can elect node-c within the test's bound
// (and, should node-b's campaign fail, deadLeaderHold: the log says how
// soon).
func crashBehind(t *testing.T, a, b, c *Host) {
	t.Helper()
	for _, h := range []*Host{b, c} {
		slowTimers(t, h, time.Minute)
	}
	crashed := time.Now()
	crash(t, a)
	var l *Host
	eventually(t, 20*time.Second, "a new leader", func() bool { l = leaderOf([]*Host{b, c}, 0); return l != nil })
	t.Logf("%s leads %v after the crash", l.NodeID(), time.Since(crashed).Round(time.Millisecond))
	if l != c {
		t.Fatalf("%s leads, want node-c (node-b's log is behind)", l.NodeID())
	}
}

// TestRetryStale: an RPC that found its connection ended is sent again, up
// to staleRetries times; any other error is returned at once.
func TestRetryStale(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errs  []error
		calls int
		ok    bool
	}{
		{"EOF then success", []error{io.EOF, nil}, 2, true},
		{"reset, EOF text, then success", []error{syscall.ECONNRESET, errors.New("EOF"), nil}, 3, true},
		{"refused: not retried", []error{syscall.ECONNREFUSED, nil}, 1, false},
		{"always ended", []error{io.EOF, io.EOF, io.EOF, io.EOF, io.EOF, io.EOF, nil}, staleRetries + 1, false},
	} {
		calls := 0
		err := retryStale(func() error { e := tc.errs[calls]; calls++; return e })
		if calls != tc.calls || (err == nil) != tc.ok {
			t.Errorf("%s: %d calls, err %v; want %d calls, success %v", tc.name, calls, err, tc.calls, tc.ok)
		}
	}
}
