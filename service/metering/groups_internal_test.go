package metering

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/nodeport"
)

// growingHost is a node that leads every group and adds groups while the
// service runs, as a raise of the group count does. A proposal is applied to
// the group's module at once, as raft would after commit.
type growingHost struct {
	mu       sync.Mutex
	mods     []*fsmmeter.Module
	proposed map[int]map[byte]int // group → entry type → proposals applied
}

func newGrowingHost(groups int) *growingHost {
	h := &growingHost{proposed: map[int]map[byte]int{}}
	for range groups {
		h.addGroup()
	}
	return h
}

// addGroup adds the next group.
func (h *growingHost) addGroup() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mods = append(h.mods, fsmmeter.New(len(h.mods)))
}

func (h *growingHost) Groups() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mods)
}

func (h *growingHost) GroupOf(hash uint64) int { return int(hash % uint64(h.Groups())) }
func (h *growingHost) HomeOf(hash uint64) int  { return h.GroupOf(hash) }
func (h *growingHost) Leads(g int) bool        { return g < h.Groups() }
func (h *growingHost) Hosts(g int) bool        { return g < h.Groups() }
func (h *growingHost) NodeID() string          { return "n1" }

func (h *growingHost) Module(g int) *fsmmeter.Module {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mods[g]
}

// TenantsActive gives every group one active series, so a sampler that runs
// proposes a series sample on its first pass.
func (h *growingHost) TenantsActive(int) []fsmmeter.TenantActive {
	return []fsmmeter.TenantActive{{Tenant: "t1", Active: 1}}
}

func (h *growingHost) Propose(_ context.Context, g int, typ byte, payload []byte) (any, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proposed[g] == nil {
		h.proposed[g] = map[byte]int{}
	}
	h.proposed[g][typ]++
	return h.mods[g].Apply(fsm.ModuleEntry{Type: typ, Payload: payload})
}

func (h *growingHost) proposals(g int, typ byte) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.proposed[g][typ]
}

func (h *growingHost) Append(int, byte, []byte) (func(context.Context) (any, error), error) {
	return nil, errors.New("growingHost: Propose only")
}

func (h *growingHost) LeaderConn(context.Context, int) (*grpc.ClientConn, context.Context, error) {
	return nil, nil, status.Error(codes.Unavailable, "growingHost leads every group")
}

func (h *growingHost) PeerConn(string) (*grpc.ClientConn, error) {
	return nil, errors.New("growingHost: no peers")
}

// targetIn returns a target that GroupOf places in group g of n.
func targetIn(t *testing.T, g, n int) fsmmeter.Target {
	t.Helper()
	for i := range 1000 {
		tg := fsmmeter.Target{Org: "o1", Space: "s1", Consumer: "c1", Resource: "r1", Plan: "p1", Instance: fmt.Sprintf("i%d", i)}
		if int(fsmmeter.TargetHash(tg)%uint64(n)) == g {
			return tg
		}
	}
	t.Fatalf("no target in group %d of %d", g, n)
	return fsmmeter.Target{}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGroupsAddedWhileRunning: a group the host adds after New is served
// like the first ones: its first event goes through its own batcher into
// its log (single and batch calls), and its sampler runs even when no event
// reaches it. Stop ends the goroutines of the added groups too.
func TestGroupsAddedWhileRunning(t *testing.T) {
	host := newGrowingHost(1)
	svc, err := New(Config{TestClock: true}, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC).UnixMilli()
	if err := svc.Clock().Set(now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := func(id string, target fsmmeter.Target) fsmmeter.Event {
		return fsmmeter.Event{Kind: fsmmeter.Start, ID: id, Timestamp: now, Target: target,
			Measures: []fsmmeter.Measure{{Name: "instances", Quantity: 1}}}
	}

	// Group 1 appears; its first event comes before the service could have
	// looked for new groups.
	host.addGroup()
	resp, err := svc.Submit(ctx, start("e1", targetIn(t, 1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Group != 1 || resp.Duplicate {
		t.Fatalf("event answered for group %d (duplicate %v), want created in group 1", resp.Group, resp.Duplicate)
	}
	if n := host.proposals(1, fsmmeter.EntryEvents); n != 1 {
		t.Fatalf("%d event entries proposed to group 1, want 1", n)
	}
	if open := host.Module(1).Stats(svc.Grid(), now).SpansOpen; open != 1 {
		t.Fatalf("group 1 holds %d open spans, want 1", open)
	}

	// Group 2 appears and gets a batch of events: through its batcher too.
	host.addGroup()
	out := svc.SubmitBatch(ctx, []fsmmeter.Event{start("e2", targetIn(t, 2, 3)), start("e3", targetIn(t, 0, 3))})
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("batch event %d: %v", i, o.err)
		}
	}
	if n := host.proposals(2, fsmmeter.EntryEvents); n != 1 {
		t.Fatalf("%d event entries proposed to group 2, want 1", n)
	}

	// Group 3 appears and no event reaches it: its sampler starts anyway
	// (its first pass samples the active series).
	host.addGroup()
	waitFor(t, "group 3's sampler", func() bool { return host.proposals(3, fsmmeter.EntrySeries) > 0 })
	for g := range 3 {
		if host.proposals(g, fsmmeter.EntrySeries) == 0 {
			t.Fatalf("group %d: no series sample, its sampler did not run", g)
		}
	}
	if st := svc.Status(); len(st.Groups) != 4 {
		t.Fatalf("status lists %d groups, want 4", len(st.Groups))
	}

	done := make(chan struct{})
	go func() {
		svc.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return: a goroutine of an added group still runs")
	}
	// After Stop a group added later is refused, not started.
	host.addGroup()
	if _, err := svc.Submit(ctx, start("e4", targetIn(t, 4, 5))); status.Code(err) != codes.Unavailable {
		t.Fatalf("event for a group added after Stop: %v, want Unavailable", err)
	}
}

// electingHost is a node of one group whose leader is unknown (an election)
// until elect is called; from then on it leads. Every LeaderConn before
// that fails as a node's does when no leader is known.
type electingHost struct {
	*growingHost
	mu      sync.Mutex
	elected bool
	asked   int // LeaderConn calls
}

func (h *electingHost) elect() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.elected = true
}

func (h *electingHost) Leads(int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.elected
}

func (h *electingHost) LeaderConn(context.Context, int) (*grpc.ClientConn, context.Context, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.asked++
	return nil, nil, status.Error(codes.Unavailable, "group 0: no leader reachable from n1 at the moment; retry")
}

func (h *electingHost) askedLeader() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.asked
}

// TestEventWaitsOutAnElection: an event whose group has no leader known is
// held and sent again, so an election shorter than the bound is not an
// error to the client; a call another node forwarded is answered at once
// (the forwarder holds it); a group that stays without a leader is answered
// Unavailable when the caller's deadline ends.
func TestEventWaitsOutAnElection(t *testing.T) {
	host := &electingHost{growingHost: newGrowingHost(1)}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	svc := startOnTestClock(t, host, now)
	start := func(id string) fsmmeter.Event {
		return fsmmeter.Event{Kind: fsmmeter.Start, ID: id, Timestamp: now, Target: targetIn(t, 0, 1),
			Measures: []fsmmeter.Measure{{Name: "instances", Quantity: 1}}}
	}

	// Forwarded: not held.
	fctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forward.Header, "1"))
	if _, err := svc.Submit(fctx, start("fwd")); status.Code(err) != codes.Unavailable {
		t.Fatalf("forwarded event without a leader: %v, want Unavailable", err)
	}
	if n := host.askedLeader(); n != 1 {
		t.Fatalf("forwarded event: leader asked %d times, want 1", n)
	}

	// No leader for the caller's whole deadline: Unavailable, after more
	// than one try.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := svc.Submit(ctx, start("never"))
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("event without a leader for its deadline: %v, want Unavailable", err)
	}
	if n := host.askedLeader(); n < 3 {
		t.Fatalf("event without a leader: leader asked %d times in all, want it held and asked again", n)
	}

	// A leader is elected while the event waits: recorded, once.
	heldUntilElected(t, svc, host, svc, start("held"))
}

// forwardingHost is a node that leads no group and sends every group's
// events to one other node over a real gRPC connection.
type forwardingHost struct {
	*growingHost
	pool *nodeport.Pool
	addr string
}

func (h *forwardingHost) Leads(int) bool { return false }
func (h *forwardingHost) LeaderConn(ctx context.Context, _ int) (*grpc.ClientConn, context.Context, error) {
	return h.pool.Forward(ctx, h.addr)
}

// TestForwardedEventWaitsOutAHandOff: node A forwards an event to node B,
// which has just lost the group's leadership and knows no leader either. B
// answers "not sent" at once (a forwarded call is not held); A holds the
// event and sends it again, and once B leads again the event is recorded
// there, once. Without the mark A could not tell B's answer from a failure
// after the entry was appended, and would answer the client Unavailable.
func TestForwardedEventWaitsOutAHandOff(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	bHost := &electingHost{growingHost: newGrowingHost(1)}
	b := startOnTestClock(t, bHost, now)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	b.RegisterGRPC(gs)
	go gs.Serve(lis)
	defer gs.Stop()

	aHost := &forwardingHost{growingHost: newGrowingHost(1), pool: nodeport.NewPool(nil, nil), addr: lis.Addr().String()}
	defer aHost.pool.Close()
	a := startOnTestClock(t, aHost, now)
	ev := fsmmeter.Event{Kind: fsmmeter.Start, ID: "fwd-held", Timestamp: now, Target: targetIn(t, 0, 1),
		Measures: []fsmmeter.Measure{{Name: "instances", Quantity: 1}}}

	// B's own answer to a forwarded call carries the mark.
	fctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forward.Header, "1"))
	if _, err := b.Submit(fctx, ev); !isNotSent(err) {
		t.Fatalf("forwarded event on a node without a leader: %v, want Unavailable marked %q", err, notSentPrefix)
	}

	heldUntilElected(t, a, bHost, b, ev)
}

// heldUntilElected submits ev through svc while host knows no leader,
// elects host's node once the event has asked for a leader twice more, and
// checks that the event was created once, in host's group 0 (which owner
// serves).
func heldUntilElected(t *testing.T, svc *Service, host *electingHost, owner *Service, ev fsmmeter.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type answer struct {
		created bool
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := svc.Submit(ctx, ev)
		done <- answer{err == nil && !r.Duplicate, err}
	}()
	before := host.askedLeader()
	waitFor(t, "the held event to ask for a leader twice", func() bool { return host.askedLeader() >= before+2 })
	host.elect()
	if a := <-done; !a.created {
		t.Fatalf("event %s held through an election: created %v, %v", ev.ID, a.created, a.err)
	}
	if open := host.Module(0).Stats(owner.Grid(), ev.Timestamp).SpansOpen; open != 1 {
		t.Fatalf("group 0 holds %d open spans, want 1 (event %s's)", open, ev.ID)
	}
}

// startOnTestClock starts a service for host on the test clock, set to now,
// and stops it when the test ends.
func startOnTestClock(t *testing.T, host Host, now int64) *Service {
	t.Helper()
	svc, err := New(Config{TestClock: true}, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	if err := svc.Clock().Set(now); err != nil {
		t.Fatal(err)
	}
	return svc
}
