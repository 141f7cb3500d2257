package sharemove

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/shares"
)

// Host is what the mover needs of the node.
type Host interface {
	// Groups is the number of raft groups.
	Groups() int
	// Module is group g's shares module on this node.
	Module(g int) *shares.Module
	// Base is group g's base share of tenant's current limit (0: unlimited).
	Base(g int, tenant string) int64
	// Usage is tenant's active series and reservations in group g on this node.
	Usage(g int, tenant string) (active, reserved int64)
	// Exclusive runs fn on group g's leader with its decider paused
	// (admission.Tracker.Exclusive); an error when this node does not lead g.
	Exclusive(g int, fn func() error) error
	// Append appends an encoded entry to group g's log (this node leads g)
	// after the cluster-version check; it must not block on the commit: wait
	// for the returned function.
	Append(g int, typ byte, data []byte) (wait func(ctx context.Context) (any, error), err error)
	// Propose is Append and wait.
	Propose(ctx context.Context, g int, typ byte, data []byte) (any, error)
	// Leads reports whether this node leads group g.
	Leads(g int) bool
	// Peer returns a client for the leader of group g.
	Peer(ctx context.Context, g int) (api.SharesClient, error)
}

// Metrics receives the mover's counters.
type Metrics interface {
	Moved(giver, receiver int, amount int64)
	Recovered(giver, receiver int, amount int64)
	Borrow(group int, got int64, d time.Duration)
}

type noMetrics struct{}

func (noMetrics) Moved(int, int, int64)            {}
func (noMetrics) Recovered(int, int, int64)        {}
func (noMetrics) Borrow(int, int64, time.Duration) {}

// Reasons a giver gives nothing that a retry may overcome.
const (
	// ReasonOutstanding: a transfer to the same receiver awaits its Complete
	// (GiveResponse.Seq names it).
	ReasonOutstanding = "a transfer to this receiver is still outstanding"
	// ReasonInFlight: the giver's free headroom is promised to a give entry
	// being committed.
	ReasonInFlight = "headroom in flight to another group"
)

// ErrNotLeader is returned when this node does not lead the group asked.
var ErrNotLeader = errors.New("not the group leader")

// RedriveAfter is how long a transfer may stay outstanding before the giver's
// leader re-drives it.
const RedriveAfter = 2 * time.Second

// Mover runs the protocol for the groups this node leads.
type Mover struct {
	h       Host
	log     *slog.Logger
	metrics Metrics

	mu      sync.Mutex
	borrows map[borrowKey]*flight
	seen    map[seenKey]time.Time // outstanding transfers first seen by the re-drive loop
	rnd     *rand.Rand
}

type borrowKey struct {
	group  int
	tenant string
}

type seenKey struct {
	group int
	seq   uint64
}

type flight struct {
	done chan struct{}
	got  int64
	busy bool
}

// New returns a mover.
func New(h Host, log *slog.Logger, m Metrics) *Mover {
	if m == nil {
		m = noMetrics{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Mover{h: h, log: log, metrics: m, borrows: map[borrowKey]*flight{}, seen: map[seenKey]time.Time{},
		rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
}

// Borrow gets at least `need` more headroom for tenant into group g (this
// node leads g) from the other groups, or as much as they can spare. It
// returns the amount received. Concurrent borrows of one (group, tenant)
// share one round: a caller arriving while one runs waits for it and returns
// what it got (the caller then re-decides, and borrows again if still short).
// busy reports that some giver had headroom it could not give at once (in
// flight to another group): a retry shortly after may succeed.
func (m *Mover) Borrow(ctx context.Context, g int, tenant string, need int64) (got int64, busy bool) {
	k := borrowKey{g, tenant}
	m.mu.Lock()
	if f := m.borrows[k]; f != nil {
		m.mu.Unlock()
		select {
		case <-f.done:
			return f.got, f.busy
		case <-ctx.Done():
			return 0, false
		}
	}
	f := &flight{done: make(chan struct{})}
	m.borrows[k] = f
	start := m.rnd.IntN(max(1, m.h.Groups()))
	m.mu.Unlock()

	t0 := time.Now()
	f.got, f.busy = m.borrow(ctx, g, tenant, need, start)
	m.metrics.Borrow(g, f.got, time.Since(t0))
	m.mu.Lock()
	delete(m.borrows, k)
	m.mu.Unlock()
	close(f.done)
	return f.got, f.busy
}

func (m *Mover) borrow(ctx context.Context, g int, tenant string, need int64, start int) (got int64, busy bool) {
	n := m.h.Groups()
	for i := 0; i < n && got < need && ctx.Err() == nil; i++ {
		giver := (start + i) % n
		if giver == g {
			continue
		}
		cli, err := m.h.Peer(ctx, giver)
		if err != nil {
			m.log.Debug("borrow: no leader for giver", "group", giver, "err", err)
			continue
		}
		resp, err := cli.Give(ctx, &api.GiveRequest{Tenant: tenant, Giver: uint32(giver), Receiver: uint32(g), Want: need - got})
		if err != nil {
			m.log.Debug("borrow: give failed", "giver", giver, "receiver", g, "err", err)
			continue
		}
		if resp.Amount <= 0 && resp.Reason == ReasonOutstanding && m.h.Module(g).Received(tenant, giver, resp.Seq) {
			// The giver still waits for the Complete of an earlier transfer
			// this group already has: complete it now and ask again.
			if _, err := cli.Complete(ctx, &api.CompleteRequest{Tenant: tenant, Giver: uint32(giver), Seq: resp.Seq}); err == nil {
				resp, err = cli.Give(ctx, &api.GiveRequest{Tenant: tenant, Giver: uint32(giver), Receiver: uint32(g), Want: need - got})
				if err != nil {
					continue
				}
			}
		}
		if resp.Amount <= 0 {
			busy = busy || resp.Reason == ReasonOutstanding || resp.Reason == ReasonInFlight
			continue
		}
		// The giver committed its reduction: the amount is in transit until
		// the receive commits. If this fails, the giver's re-drive loop
		// delivers it later.
		if _, err := m.receive(ctx, giver, g, tenant, resp.Seq, resp.Amount); err != nil {
			m.log.Warn("borrow: receive failed; the giver will re-drive it", "giver", giver, "receiver", g, "seq", resp.Seq, "err", err)
			continue
		}
		got += resp.Amount
		m.metrics.Moved(giver, g, resp.Amount)
		go m.complete(giver, tenant, resp.Seq)
	}
	return got, busy
}

// complete tells the giver's leader the receive committed (best effort; the
// re-drive loop covers a lost call).
func (m *Mover) complete(giver int, tenant string, seq uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := m.h.Peer(ctx, giver)
	if err == nil {
		_, err = cli.Complete(ctx, &api.CompleteRequest{Tenant: tenant, Giver: uint32(giver), Seq: seq})
	}
	if err != nil {
		m.log.Debug("complete failed; the giver will re-drive", "giver", giver, "seq", seq, "err", err)
	}
}

// free is group g's unused headroom for tenant on its leader: effective share
// minus active series and reservations. Call inside Exclusive.
func (m *Mover) free(g int, tenant string) (int64, bool) {
	base := m.h.Base(g, tenant)
	if base == 0 {
		return 0, false // unlimited: nothing to move
	}
	delta, res := m.h.Module(g).Delta(tenant)
	active, reserved := m.h.Usage(g, tenant)
	return base + delta - res - active - reserved, true
}

// Give serves a give request on group `giver`'s leader: it reserves up to
// want (at least half its free headroom when that is more, so repeated
// borrows converge), commits the reduction and returns the amount and seq.
func (m *Mover) Give(ctx context.Context, tenant string, giver, receiver int, want int64) (amount int64, seq uint64, reason string, err error) {
	if err := m.checkGroups(giver, receiver); err != nil {
		return 0, 0, "", err
	}
	if want <= 0 {
		return 0, 0, "", fmt.Errorf("want %d: must be > 0", want)
	}
	mod := m.h.Module(giver)
	if seq, ok := mod.OutstandingTo(tenant, receiver); ok {
		return 0, seq, ReasonOutstanding, nil
	}
	inFlight := false
	var nonce uint64
	var wait func(context.Context) (any, error)
	err = m.h.Exclusive(giver, func() error {
		free, limited := m.free(giver, tenant)
		if !limited || free <= 0 {
			_, res := mod.Delta(tenant)
			inFlight = res > 0
			return nil
		}
		amount = min(free, max(want, (free+1)/2))
		nonce = mod.Reserve(tenant, amount)
		var aerr error
		// Appended while the decider is paused, so a later batch of this
		// session sees the reservation, and a later session's barrier covers
		// the entry.
		wait, aerr = m.h.Append(giver, shares.EntryGive, shares.AppendGive(nil, shares.Give{Tenant: tenant, To: receiver, Amount: amount, Nonce: nonce}))
		if aerr != nil {
			mod.Release(tenant, nonce) // never appended
			amount = 0
			return aerr
		}
		return nil
	})
	if err != nil {
		return 0, 0, "", err
	}
	if amount == 0 {
		if inFlight {
			return 0, 0, ReasonInFlight, nil
		}
		return 0, 0, "no free headroom", nil
	}
	// On an error the reservation stays until the next leader session resets
	// it: the entry may still commit, and giving the headroom to local
	// series meanwhile could overcommit.
	res, err := wait(ctx)
	if err != nil {
		return 0, 0, "", err
	}
	gr, ok := res.(shares.GiveResult)
	if !ok {
		return 0, 0, "", fmt.Errorf("give entry: unexpected response %T", res)
	}
	if gr.Refused != "" {
		return 0, 0, gr.Refused, nil
	}
	return amount, gr.Seq, "", nil
}

// Receive serves a receive request on group `receiver`'s leader: it commits
// the increase unless the group already has it.
func (m *Mover) Receive(ctx context.Context, tenant string, giver, receiver int, seq uint64, amount int64) (bool, error) {
	if err := m.checkGroups(giver, receiver); err != nil {
		return false, err
	}
	if seq == 0 || amount <= 0 {
		return false, fmt.Errorf("seq %d amount %d: both must be > 0", seq, amount)
	}
	return m.receive(ctx, giver, receiver, tenant, seq, amount)
}

func (m *Mover) receive(ctx context.Context, giver, receiver int, tenant string, seq uint64, amount int64) (bool, error) {
	if !m.h.Leads(receiver) {
		return false, ErrNotLeader
	}
	// The leader's state holds every committed entry (its session passed
	// its barrier before it decides anything), so "received" is exact.
	if m.h.Module(receiver).Received(tenant, giver, seq) {
		return false, nil
	}
	res, err := m.h.Propose(ctx, receiver, shares.EntryReceive, shares.AppendReceive(nil, shares.Receive{Tenant: tenant, From: giver, Seq: seq, Amount: amount}))
	if err != nil {
		return false, err
	}
	rr, ok := res.(shares.ReceiveResult)
	if !ok {
		return false, fmt.Errorf("receive entry: unexpected response %T", res)
	}
	if rr.Refused != "" {
		return false, fmt.Errorf("receive refused: %s", rr.Refused)
	}
	return rr.Applied, nil
}

// Complete serves a complete request on the giver's leader.
func (m *Mover) Complete(ctx context.Context, tenant string, giver int, seq uint64) (bool, error) {
	if giver < 0 || giver >= m.h.Groups() {
		return false, fmt.Errorf("giver group %d out of range [0, %d)", giver, m.h.Groups())
	}
	if !m.h.Leads(giver) {
		return false, ErrNotLeader
	}
	res, err := m.h.Propose(ctx, giver, shares.EntryComplete, shares.AppendComplete(nil, shares.Complete{Tenant: tenant, Seq: seq}))
	if err != nil {
		return false, err
	}
	cr, _ := res.(shares.CompleteResult)
	return cr.Found, nil
}

func (m *Mover) checkGroups(giver, receiver int) error {
	n := m.h.Groups()
	if giver < 0 || giver >= n || receiver < 0 || receiver >= n || giver == receiver {
		return fmt.Errorf("giver %d receiver %d: must be distinct groups in [0, %d)", giver, receiver, n)
	}
	return nil
}

// Redrive runs once over the groups this node leads: every transfer
// outstanding for longer than `after` (as seen by this node) is delivered to
// its receiver's leader and then completed. It returns how many transfers it
// finished.
func (m *Mover) Redrive(ctx context.Context, after time.Duration) int {
	now := time.Now()
	done := 0
	live := map[seenKey]bool{}
	for g := range m.h.Groups() {
		if !m.h.Leads(g) {
			continue
		}
		for _, o := range m.h.Module(g).Outstanding() {
			k := seenKey{g, o.Seq}
			live[k] = true
			m.mu.Lock()
			first, ok := m.seen[k]
			if !ok {
				m.seen[k] = now
				first = now
			}
			m.mu.Unlock()
			if now.Sub(first) < after {
				continue
			}
			cli, err := m.h.Peer(ctx, o.To)
			if err != nil {
				continue
			}
			resp, err := cli.Receive(ctx, &api.ReceiveRequest{Tenant: o.Tenant, Giver: uint32(g), Receiver: uint32(o.To), Seq: o.Seq, Amount: o.Amount})
			if err != nil {
				m.log.Debug("re-drive: receive failed", "giver", g, "receiver", o.To, "seq", o.Seq, "err", err)
				continue
			}
			if resp.AppliedNow {
				m.metrics.Recovered(g, o.To, o.Amount)
				m.log.Info("stranded headroom delivered", "tenant", o.Tenant, "giver", g, "receiver", o.To, "seq", o.Seq, "amount", o.Amount)
			}
			if _, err := m.Complete(ctx, o.Tenant, g, o.Seq); err == nil {
				done++
			}
		}
	}
	m.mu.Lock()
	for k := range m.seen {
		if !live[k] {
			delete(m.seen, k)
		}
	}
	m.mu.Unlock()
	return done
}

// Run re-drives outstanding transfers every `every` until ctx ends.
func (m *Mover) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Redrive(ctx, RedriveAfter)
		}
	}
}
