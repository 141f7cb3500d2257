package shares

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/shares"
)

// FAKE: the tests below run the mover's protocol against a fake of its Host
// interface, because the mover's job is the order of gives, receives and
// completes across groups, not raft. Each group's replicated state is ONE
// real shares.Module that every "node" shares (no replication, no disk);
// Append applies the entry at once with an increasing index (a committed
// entry); Peer calls the Mover of the node the fake says leads the group,
// in-process. The real wiring (raft, gRPC, real processes) is tested in
// server/ and faulttest/ (TestMovableSharesUnderFaults).

const tenant = "t"

type fakeCluster struct {
	t      *testing.T
	groups int

	mu      sync.Mutex
	limit   int64
	mods    []*shares.Module
	active  []int64 // tenant's active series per group
	leader  []int   // node leading each group
	index   []uint64
	movers  []*Mover
	excl    []sync.Mutex // Exclusive: one per group, like the paused decider
	metrics *countMetrics
	// dropGive, when set, makes the next Give answered by a peer fail after
	// the giver committed it (the giver's leader crashed before answering)
	// and hands the giver's leadership to node newLeader.
	dropGive  bool
	newLeader int
	// deferGive, when set, makes give entries wait in `pending` (appended,
	// not yet committed); their wait fails as a commit timeout would.
	deferGive bool
	pending   []pendingEntry
}

type pendingEntry struct {
	g    int
	typ  byte
	data []byte
}

// commitPending applies the deferred entries (they commit after all).
func (c *fakeCluster) commitPending() {
	c.mu.Lock()
	p := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, e := range p {
		c.mu.Lock()
		c.index[e.g]++
		idx := c.index[e.g]
		c.mu.Unlock()
		if _, err := c.mods[e.g].Apply(fsm.ModuleEntry{Type: e.typ, Index: idx, Payload: e.data}); err != nil {
			c.t.Fatal(err)
		}
	}
}

func newFake(t *testing.T, groups, nodes int, limit int64) *fakeCluster {
	c := &fakeCluster{t: t, groups: groups, limit: limit, active: make([]int64, groups), leader: make([]int, groups),
		index: make([]uint64, groups), excl: make([]sync.Mutex, groups), metrics: &countMetrics{}}
	for g := range groups {
		m, err := shares.New(g, groups)
		if err != nil {
			t.Fatal(err)
		}
		c.mods = append(c.mods, m)
	}
	for n := range nodes {
		c.movers = append(c.movers, New(fakeHost{c, n}, nil, c.metrics))
	}
	return c
}

// sumShares is Σ_g (base_g + delta_g): it must never exceed the limit.
func (c *fakeCluster) sumShares() int64 {
	var s int64
	for g := range c.groups {
		d, _ := c.mods[g].Delta(tenant)
		s += shares.Split(c.limit, g, g+1, c.groups) + d
	}
	return s
}

func (c *fakeCluster) delta(g int) int64 {
	d, _ := c.mods[g].Delta(tenant)
	return d
}

func (c *fakeCluster) outstanding() int {
	n := 0
	for _, m := range c.mods {
		n += len(m.Outstanding())
	}
	return n
}

// waitCompleted waits for the mover's background Complete calls (a hang
// guard, not a timing assertion).
func (c *fakeCluster) waitCompleted() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.outstanding() > 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d transfers still outstanding", c.outstanding())
		}
		time.Sleep(time.Millisecond)
	}
}

type fakeHost struct {
	c    *fakeCluster
	node int
}

func (h fakeHost) Groups() int    { return h.c.groups }
func (h fakeHost) NodeID() string { return fmt.Sprint("node-", h.node) }
func (h fakeHost) Hosts(int) bool { return true }

// The fake cluster's mover reaches other groups through Peer only.
func (h fakeHost) LeaderConn(context.Context, int) (*grpc.ClientConn, context.Context, error) {
	return nil, nil, status.Error(codes.Unavailable, "fake cluster: no connections")
}
func (h fakeHost) PeerConn(string) (*grpc.ClientConn, error) {
	return nil, status.Error(codes.Unavailable, "fake cluster: no connections")
}
func (h fakeHost) Module(g int) *shares.Module { return h.c.mods[g] }
func (h fakeHost) Usage(g int, _ string) (int64, int64) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.active[g], 0
}
func (h fakeHost) Limit(int, string) (int64, uint64) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.limit, uint64(h.c.limit) // a new limit is a new version
}

func (h fakeHost) Base(g int, _ string) int64 {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	// One partition per group.
	return shares.Split(h.c.limit, g, g+1, h.c.groups)
}
func (h fakeHost) Leads(g int) bool {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.leader[g] == h.node
}
func (h fakeHost) Exclusive(g int, fn func() error) error {
	if !h.Leads(g) {
		return ErrNotLeader
	}
	h.c.excl[g].Lock()
	defer h.c.excl[g].Unlock()
	return fn()
}
func (h fakeHost) Append(g int, typ byte, data []byte) (func(context.Context) (any, error), error) {
	if !h.Leads(g) {
		return nil, ErrNotLeader
	}
	h.c.mu.Lock()
	if h.c.deferGive && typ == shares.EntryGive {
		h.c.pending = append(h.c.pending, pendingEntry{g, typ, data})
		h.c.mu.Unlock()
		return func(context.Context) (any, error) { return nil, errors.New("fake: commit not confirmed in time") }, nil
	}
	h.c.index[g]++
	idx := h.c.index[g]
	h.c.mu.Unlock()
	res, err := h.c.mods[g].Apply(fsm.ModuleEntry{Type: typ, Index: idx, Payload: data})
	return func(context.Context) (any, error) { return res, err }, nil
}
func (h fakeHost) Propose(ctx context.Context, g int, typ byte, data []byte) (any, error) {
	wait, err := h.Append(g, typ, data)
	if err != nil {
		return nil, err
	}
	return wait(ctx)
}
func (h fakeHost) Peer(_ context.Context, g int) (api.SharesClient, error) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return fakePeer{h.c, h.c.leader[g]}, nil
}

// fakePeer calls another node's Mover in-process.
type fakePeer struct {
	c    *fakeCluster
	node int
}

var errCrashed = errors.New("fake: the giver's leader crashed before answering")

func (p fakePeer) Give(ctx context.Context, in *api.GiveRequest, _ ...grpc.CallOption) (*api.GiveResponse, error) {
	amt, seq, reason, err := p.c.movers[p.node].Give(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Want)
	if err != nil {
		return nil, err
	}
	p.c.mu.Lock()
	drop := p.c.dropGive && amt > 0
	if drop {
		p.c.dropGive = false
		p.c.leader[in.Giver] = p.c.newLeader
	}
	p.c.mu.Unlock()
	if drop {
		return nil, errCrashed
	}
	return &api.GiveResponse{Amount: amt, Seq: seq, Reason: reason}, nil
}
func (p fakePeer) Receive(ctx context.Context, in *api.ReceiveRequest, _ ...grpc.CallOption) (*api.ReceiveResponse, error) {
	now, err := p.c.movers[p.node].Receive(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Seq, in.Amount)
	if err != nil {
		return nil, err
	}
	return &api.ReceiveResponse{AppliedNow: now}, nil
}
func (p fakePeer) Complete(ctx context.Context, in *api.CompleteRequest, _ ...grpc.CallOption) (*api.CompleteResponse, error) {
	found, err := p.c.movers[p.node].Complete(ctx, in.Tenant, int(in.Giver), in.Seq)
	if err != nil {
		return nil, err
	}
	return &api.CompleteResponse{Found: found}, nil
}

func (p fakePeer) Cover(ctx context.Context, in *api.CoverRequest, _ ...grpc.CallOption) (*api.CoverResponse, error) {
	ok, over, reason, err := p.c.movers[p.node].Cover(ctx, in.Tenant, int(in.Group), in.MaxSeries)
	if err != nil {
		return nil, err
	}
	return &api.CoverResponse{Covered: ok, Overdraft: over, Reason: reason}, nil
}

func (p fakePeer) TenantShares(context.Context, *api.TenantSharesRequest, ...grpc.CallOption) (*api.TenantSharesResponse, error) {
	return nil, errors.New("fake: not used by the mover")
}

type countMetrics struct {
	mu                 sync.Mutex
	moved, recovered   int64
	borrows, borrowGot int64
}

func (m *countMetrics) Moved(_, _ int, a int64) {
	m.mu.Lock()
	m.moved += a
	m.mu.Unlock()
}
func (m *countMetrics) Recovered(_, _ int, a int64) {
	m.mu.Lock()
	m.recovered += a
	m.mu.Unlock()
}
func (m *countMetrics) Borrow(_ int, got int64, _ time.Duration) {
	m.mu.Lock()
	m.borrows++
	m.borrowGot += got
	m.mu.Unlock()
}

func TestBorrowMovesFreeHeadroom(t *testing.T) {
	c := newFake(t, 4, 1, 40) // bases 10 each
	c.active = []int64{10, 10, 4, 10}
	got, busy := c.movers[0].Borrow(context.Background(), 0, tenant, 2)
	// Group 2 has 6 free: it gives max(want 2, ⌈6/2⌉ = 3).
	if got != 3 || busy {
		t.Fatalf("Borrow = (%d, %v), want (3, false)", got, busy)
	}
	c.waitCompleted()
	if c.delta(0) != 3 || c.delta(2) != -3 || c.sumShares() != 40 {
		t.Fatalf("deltas %d/%d, Σ shares %d; want +3/−3 and 40", c.delta(0), c.delta(2), c.sumShares())
	}
	if c.metrics.moved != 3 || c.metrics.recovered != 0 {
		t.Fatalf("metrics moved %d recovered %d", c.metrics.moved, c.metrics.recovered)
	}
}

func TestBorrowNoHeadroom(t *testing.T) {
	c := newFake(t, 4, 1, 40)
	c.active = []int64{10, 10, 10, 10}
	got, busy := c.movers[0].Borrow(context.Background(), 0, tenant, 5)
	if got != 0 || busy {
		t.Fatalf("Borrow = (%d, %v), want (0, false): no group has headroom", got, busy)
	}
	for g := range 4 {
		if d := c.delta(g); d != 0 {
			t.Fatalf("group %d delta %d after a borrow that found nothing", g, d)
		}
	}
	if c.outstanding() != 0 {
		t.Fatal("a transfer is outstanding after a borrow that found nothing")
	}
	// An unlimited tenant has nothing to move either.
	c.limit = 0
	if got, busy := c.movers[0].Borrow(context.Background(), 0, tenant, 5); got != 0 || busy {
		t.Fatalf("unlimited: Borrow = (%d, %v)", got, busy)
	}
}

func TestBorrowGiverBusy(t *testing.T) {
	c := newFake(t, 2, 1, 20) // bases 10/10
	c.active = []int64{10, 2}
	// Group 1's free headroom (8) is promised to a give entry in flight.
	nonce := c.mods[1].Reserve(tenant, 8)
	got, busy := c.movers[0].Borrow(context.Background(), 0, tenant, 1)
	if got != 0 || !busy {
		t.Fatalf("in flight: Borrow = (%d, %v), want (0, true): a retry may succeed", got, busy)
	}
	if c.delta(1) != 0 {
		t.Fatalf("giver with headroom in flight gave: delta %d", c.delta(1))
	}
	c.mods[1].Release(tenant, nonce)

	// A transfer 1 → 0 is outstanding and group 0 has NOT received it (the
	// borrower that asked for it crashed): the next give to 0 delivers and
	// completes it first (transfers arrive in seq order), then gives more.
	amt, seq, reason, err := c.movers[0].Give(context.Background(), tenant, 1, 0, 2)
	if err != nil || amt != 4 || seq == 0 {
		t.Fatalf("Give = (%d, %d, %q, %v)", amt, seq, reason, err)
	}
	if c.delta(0) != 0 || c.sumShares() != 16 {
		t.Fatalf("receiver delta %d, Σ shares %d: want 0 and 16 (4 in transit)", c.delta(0), c.sumShares())
	}
	got, busy = c.movers[0].Borrow(context.Background(), 0, tenant, 1)
	if got != 2 || busy { // group 1 has 10−4−2 = 4 free: gives ⌈4/2⌉
		t.Fatalf("outstanding, not received: Borrow = (%d, %v), want (2, false)", got, busy)
	}
	if !c.mods[0].Received(tenant, 1, seq) {
		t.Fatalf("the earlier transfer seq %d was not delivered", seq)
	}
	c.waitCompleted()
	if c.delta(0) != 6 || c.delta(1) != -6 || c.sumShares() != 20 {
		t.Fatalf("deltas %d/%d Σ %d", c.delta(0), c.delta(1), c.sumShares())
	}
}

// TestGiverFailoverStranded: the giver commits its give, then its leader
// crashes before answering; the borrow gets nothing and the headroom is in
// transit (Σ shares < limit). The giver's next leader re-drives it from the
// replicated outstanding list: the receiver gets it exactly once.
func TestGiverFailoverStranded(t *testing.T) {
	c := newFake(t, 2, 3, 20)
	c.leader = []int{0, 1} // node 0 leads the receiver, node 1 the giver
	c.active = []int64{10, 0}
	c.dropGive, c.newLeader = true, 2
	got, _ := c.movers[0].Borrow(context.Background(), 0, tenant, 3)
	if got != 0 {
		t.Fatalf("Borrow got %d through a crashed giver", got)
	}
	if c.delta(1) != -5 || c.delta(0) != 0 || c.outstanding() != 1 || c.sumShares() != 15 {
		t.Fatalf("after the crash: deltas %d/%d, outstanding %d, Σ %d; want −5/0, 1, 15",
			c.delta(0), c.delta(1), c.outstanding(), c.sumShares())
	}
	// The old leader (node 1) no longer leads group 1: it re-drives nothing.
	if n := c.movers[1].Redrive(context.Background(), 0); n != 0 {
		t.Fatalf("old leader re-drove %d transfers", n)
	}
	// The new leader sees the transfer first and waits `after` before
	// re-driving (the borrower may still be delivering it).
	if n := c.movers[2].Redrive(context.Background(), time.Hour); n != 0 || c.outstanding() != 1 {
		t.Fatalf("re-drove %d transfers before `after`", n)
	}
	if n := c.movers[2].Redrive(context.Background(), 0); n != 1 {
		t.Fatalf("new leader re-drove %d transfers, want 1", n)
	}
	if c.delta(0) != 5 || c.delta(1) != -5 || c.outstanding() != 0 || c.sumShares() != 20 {
		t.Fatalf("after the re-drive: deltas %d/%d, outstanding %d, Σ %d", c.delta(0), c.delta(1), c.outstanding(), c.sumShares())
	}
	if c.metrics.recovered != 5 {
		t.Fatalf("recovered metric %d, want 5", c.metrics.recovered)
	}
	// Nothing left to re-drive; the receiver's share now admits the series.
	if n := c.movers[2].Redrive(context.Background(), 0); n != 0 {
		t.Fatalf("second re-drive did %d", n)
	}
}

// TestDuplicateReceive: a receive delivered twice (the borrower's own and a
// re-drive racing it, or a retried RPC) raises the share once.
func TestDuplicateReceive(t *testing.T) {
	c := newFake(t, 2, 1, 20)
	c.active = []int64{10, 0}
	amt, seq, _, err := c.movers[0].Give(context.Background(), tenant, 1, 0, 3)
	if err != nil || amt != 5 {
		t.Fatalf("Give = %d, %v", amt, err)
	}
	for i, want := range []bool{true, false, false} {
		now, err := c.movers[0].Receive(context.Background(), tenant, 1, 0, seq, amt)
		if err != nil || now != want {
			t.Fatalf("receive #%d: applied now %v, %v; want %v", i+1, now, err, want)
		}
	}
	if c.delta(0) != 5 || c.sumShares() != 20 {
		t.Fatalf("delta %d, Σ %d after duplicate receives", c.delta(0), c.sumShares())
	}
	// A re-drive of the (received, not completed) transfer does not count it
	// as recovered and only completes it.
	if n := c.movers[0].Redrive(context.Background(), 0); n != 1 {
		t.Fatalf("re-drive completed %d", n)
	}
	if c.delta(0) != 5 || c.outstanding() != 0 || c.metrics.recovered != 0 {
		t.Fatalf("after re-drive: delta %d outstanding %d recovered %d", c.delta(0), c.outstanding(), c.metrics.recovered)
	}
	// Bad input is refused, not applied.
	if _, err := c.movers[0].Receive(context.Background(), tenant, 1, 0, 0, 5); err == nil {
		t.Fatal("receive with seq 0 accepted")
	}
	if _, err := c.movers[0].Receive(context.Background(), tenant, 1, 1, seq, 5); err == nil {
		t.Fatal("receive from a group to itself accepted")
	}
	if _, _, _, err := c.movers[0].Give(context.Background(), tenant, 1, 0, 0); err == nil {
		t.Fatal("give with want 0 accepted")
	}
}

// TestConcurrentBorrows: callers borrowing for the same (group, tenant) at
// once never take more than the givers had, and Σ shares stays at the limit.
func TestConcurrentBorrows(t *testing.T) {
	c := newFake(t, 4, 1, 400)
	c.active = []int64{100, 0, 0, 0}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _ := c.movers[0].Borrow(context.Background(), 0, tenant, 10)
			mu.Lock()
			total += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.waitCompleted()
	if d := c.delta(0); d <= 0 || d > 300 || c.sumShares() != 400 {
		t.Fatalf("receiver delta %d, Σ shares %d", d, c.sumShares())
	}
}

// TestGiveCommitUnconfirmed: a give whose commit the giver could not confirm
// (timeout, leadership lost) keeps its headroom reserved: the entry may still
// commit, and handing the headroom to local series meanwhile could let both
// groups use it. The reservation ends when the entry applies (it releases its
// nonce, and the transfer is then re-driven to the receiver) or, if the entry
// never commits, when the next leader session resets reservations.
func TestGiveCommitUnconfirmed(t *testing.T) {
	c := newFake(t, 3, 1, 30) // bases 10
	c.active = []int64{10, 2, 10}
	c.deferGive = true
	amt, _, _, err := c.movers[0].Give(context.Background(), tenant, 1, 0, 1)
	if err == nil || amt != 0 {
		t.Fatalf("unconfirmed give: amount %d, err %v", amt, err)
	}
	if _, res := c.mods[1].Delta(tenant); res != 4 {
		t.Fatalf("reservation %d after an unconfirmed give, want 4 (⌈8/2⌉)", res)
	}
	c.deferGive = false
	// Meanwhile the reserved headroom is not given again.
	amt, _, _, err = c.movers[0].Give(context.Background(), tenant, 1, 2, 8)
	if err != nil || amt != 4 {
		t.Fatalf("second give: amount %d (want the 4 not reserved), err %v", amt, err)
	}
	// The first entry commits after all: the reservation goes with it and
	// the re-drive delivers it; nothing is lost or counted twice.
	c.commitPending()
	if _, res := c.mods[1].Delta(tenant); res != 0 {
		t.Fatalf("reservation %d after the entry applied", res)
	}
	if n := c.movers[0].Redrive(context.Background(), 0); n != 2 {
		t.Fatalf("re-drive finished %d transfers, want 2", n)
	}
	if c.delta(0) != 4 || c.delta(1) != -8 || c.delta(2) != 4 || c.sumShares() != 30 || c.outstanding() != 0 {
		t.Fatalf("deltas %d/%d/%d Σ %d outstanding %d", c.delta(0), c.delta(1), c.delta(2), c.sumShares(), c.outstanding())
	}

	// An entry that never commits (a new leader overwrote it): the next
	// session's reset frees the reservation, and the headroom stays home.
	c.active[1] = 0 // group 1: share 2, all free
	c.deferGive = true
	if amt, _, _, err := c.movers[0].Give(context.Background(), tenant, 1, 0, 1); err == nil || amt != 0 {
		t.Fatalf("unconfirmed give: %d, %v", amt, err)
	}
	c.mu.Lock()
	c.pending = nil // truncated by the next leader
	c.mu.Unlock()
	if _, res := c.mods[1].Delta(tenant); res == 0 {
		t.Fatal("no reservation for the unconfirmed give")
	}
	c.mods[1].ResetReservations() // what admission's new leader session does after its barrier
	if d, res := c.mods[1].Delta(tenant); res != 0 || d != -8 {
		t.Fatalf("after the reset: delta %d reservation %d, want −8 and 0", d, res)
	}
}
