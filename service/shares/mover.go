package shares

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/limits"
	"github.com/tollgate-io/tollgate/nodeport"
)

// Host is what the mover needs of the node: the node's port (leadership,
// proposals — Append for a give it pipelines, Propose for the rest — and
// the leader's connection) and the shares state of each group.
type Host interface {
	nodeport.Port
	// Module is group g's shares module on this node: every group below
	// Groups() has one (the count grows only after the module exists), a
	// group beyond it may not (nil).
	Module(g int) *shares.Module
	// Base is group g's base share of tenant's current limit (0: unlimited).
	Base(g int, tenant string) int64
	// Limit is tenant's max_series as group g applied it (0: unlimited) and
	// the runtime config version that set it.
	Limit(g int, tenant string) (limit int64, version uint64)
	// Usage is tenant's active series and reservations in group g on this node.
	Usage(g int, tenant string) (active, reserved int64)
	// Exclusive runs fn on group g's leader with its decider paused
	// (admission.Tracker.Exclusive); an error when this node does not lead g.
	Exclusive(g int, fn func() error) error
	// Peer returns a client for the shares service of group g's leader: this
	// node's own service when it leads g.
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

	// Hooks a deterministic simulation replaces: how the borrow asks the
	// groups (default: all at once), how a best-effort Complete runs
	// (default: its own goroutine) and how Admit waits between rounds.
	turn   uint64 // which giver a borrow asks first
	fanout func(n int, f func(i int))
	spawn  func(f func())
	sleep  func(ctx context.Context, d time.Duration) error
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
		fanout: parallel, spawn: func(f func()) { go f() }, sleep: sleepCtx}
}

func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(i) }()
	}
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrHeadroomUnreachable is returned by Admit when series were refused at
// their group's share but the tenant's other groups could not all answer
// (no leader, a give or receive failed, headroom still in flight): whether
// the tenant is at its limit is unknown, so the request is retryable, never
// a rejection below the limit.
var ErrHeadroomUnreachable = errors.New("headroom of other groups unreachable")

// admitRounds bounds the borrow-and-re-decide rounds of one request; each
// round asks every other group at once, and a giver gives at least half its
// free headroom, so a handful of rounds gathers everything that exists.
const admitRounds = 12

// Decider decides hashes in the receiving group: the rejected hashes and how
// many of them were refused only for the group's share.
type Decider func(ctx context.Context, hashes []uint64) (rejected []uint64, atShare int, err error)

// Admit decides a request in group g (this node leads g) and, while series
// are refused only for the group's share, borrows the headroom they need
// from every other group and decides them again. It returns the rejected
// hashes and how many of them were refused at the tenant-wide limit (every
// other group answered that it has no free headroom). When that cannot be
// established (a group has no leader, headroom stays in flight) it returns
// an error wrapping ErrHeadroomUnreachable instead of a rejection.
func (m *Mover) Admit(ctx context.Context, g int, tenant string, hashes []uint64, decide Decider) ([]uint64, int, error) {
	// Until the tenant is settled the group's share admits no new series
	// (Settled), but refreshes of active series never wait for other groups.
	indebted, serr := m.settle(ctx, g, tenant)
	rejected, atShare, err := decide(ctx, hashes)
	if err != nil || atShare == 0 {
		return rejected, 0, err
	}
	if serr != nil {
		return nil, 0, serr
	}
	if indebted {
		// Some group holds more than its share and no group had headroom
		// for it: the tenant is at or above its limit, and headroom that
		// frees up belongs to that group first.
		return rejected, atShare, nil
	}
	for round := 0; round < admitRounds; round++ {
		got, short := m.Borrow(ctx, g, tenant, int64(atShare))
		if got == 0 {
			if !short {
				return rejected, atShare, nil // no group has headroom: the tenant is at its limit
			}
			if err := m.sleep(ctx, time.Duration(round+1)*2*time.Millisecond); err != nil {
				return nil, 0, err
			}
			continue
		}
		rejected, atShare, err = decide(ctx, rejected)
		if err != nil || atShare == 0 {
			return rejected, 0, err
		}
	}
	return nil, 0, fmt.Errorf("tenant %s: %d series refused at group %d's share: %w; retry", tenant, atShare, g, ErrHeadroomUnreachable)
}

// settle makes sure, once per leader session and limit of the tenant, that
// no group holds more series than its share before group g admits new ones:
// after a lowered limit a group's share can fall below its series, and the
// headroom other groups still have would then let the tenant exceed its
// limit. Every group is asked to cover (Cover) at g's limit; until all
// answer, the request is retryable.
func (m *Mover) settle(ctx context.Context, g int, tenant string) (indebted bool, err error) {
	limit, version := m.h.Limit(g, tenant)
	if limit == 0 {
		return false, nil
	}
	mod := m.h.Module(g)
	// Any version change re-settles: the limit may have gone down and up
	// again in between.
	cur := shares.Settled{Limit: limit, Version: version}
	if l, ok := mod.Settled(tenant); ok && l == cur {
		return false, nil
	}
	n := m.h.Groups()
	errs := make([]error, n)
	debts := make([]int64, n)
	m.fanout(n, func(i int) {
		cli, err := m.h.Peer(ctx, i)
		if err != nil {
			errs[i] = err
			return
		}
		resp, err := cli.Cover(ctx, &api.CoverRequest{Tenant: tenant, Group: uint32(i), MaxSeries: limit})
		switch {
		case status.Code(err) == codes.Unimplemented:
			// A leader of an earlier build (a rolling upgrade): it has no
			// Cover, and admits as that build did; waiting for it would
			// refuse every tenant until the upgrade ends.
		case err != nil:
			errs[i] = err
		case !resp.Covered:
			errs[i] = errors.New(resp.Reason)
		default:
			debts[i] = resp.Overdraft
		}
	})
	for i, err := range errs {
		if err != nil {
			return false, fmt.Errorf("tenant %s: max_series %d not settled: group %d: %v: %w; retry", tenant, limit, i, err, ErrHeadroomUnreachable)
		}
	}
	for _, d := range debts {
		if d > 0 {
			// Settled only once the debt is paid: every request asks again,
			// so the indebted group takes headroom as it frees up.
			return true, nil
		}
	}
	mod.SetSettled(tenant, cur)
	return false, nil
}

// Settled reports whether group g may admit new series of tenant within its
// share: the tenant is unlimited, or this leader session settled it at the
// limit g applied (Admit settles first). A share function returns
// admission.NoHeadroom otherwise.
func (m *Mover) Settled(g int, tenant string) bool {
	limit, version := m.h.Limit(g, tenant)
	if limit == 0 {
		return true
	}
	mod := m.h.Module(g)
	if mod == nil {
		return false // a group not added here yet (Node.AddGroup): no session settled it
	}
	l, ok := mod.Settled(tenant)
	return ok && l == shares.Settled{Limit: limit, Version: version}
}

// Cover serves a cover request on group g's leader: when the group holds
// more of tenant's series than its share (its base fell with a lowered
// limit), it borrows the difference from the other groups. covered is
// false when g is not at limit yet or headroom is unreachable; overdraft is
// what no group had headroom for (the tenant is above its limit: the
// groups' free headroom is all here now, so none admits a new series).
func (m *Mover) Cover(ctx context.Context, tenant string, g int, limit int64) (covered bool, overdraft int64, reason string, err error) {
	if g < 0 || g >= m.h.Groups() {
		return false, 0, "", fmt.Errorf("group %d out of range [0, %d)", g, m.h.Groups())
	}
	if !m.h.Leads(g) {
		return false, 0, "", ErrNotLeader
	}
	if cur, _ := m.h.Limit(g, tenant); cur != limit {
		return false, 0, fmt.Sprintf("group %d applied max_series %d, not %d yet", g, cur, limit), nil
	}
	for range admitRounds {
		var over int64
		// Read with the decider paused: a partition hand-off changes
		// usage and share in one entry applied while decisions wait
		// (admission.Tracker.AppendFenced), never seen half done here.
		if err := m.h.Exclusive(g, func() error { over = m.overdraft(g, tenant); return nil }); err != nil {
			return false, 0, "", err
		}
		if over <= 0 {
			return true, 0, "", nil
		}
		got, short := m.Borrow(ctx, g, tenant, over)
		if got == 0 {
			if short {
				return false, over, "headroom of other groups unreachable", nil
			}
			return true, over, "", nil
		}
	}
	return false, m.overdraft(g, tenant), "still above its share", nil
}

// overdraft is how many more series group g holds for tenant than its share.
// Usage only grows within the share, so a group that is not overdrawn
// cannot become so without a change of its base.
func (m *Mover) overdraft(g int, tenant string) int64 {
	base := m.h.Base(g, tenant)
	delta, res := m.h.Module(g).Delta(tenant)
	active, reserved := m.h.Usage(g, tenant)
	return active + reserved - (base + delta - res)
}

// Borrow gets at least `need` more headroom for tenant into group g (this
// node leads g) from the other groups, or as much as they can spare, asking
// them all at once. It returns the amount received. Concurrent borrows of
// one (group, tenant) share one round: a caller arriving while one runs
// waits for it and returns what it got (the caller then re-decides, and
// borrows again if still short). short reports that some group could not
// answer "no free headroom" (no leader, an error, headroom in flight to
// another group or still in transit): a retry may get more.
func (m *Mover) Borrow(ctx context.Context, g int, tenant string, need int64) (got int64, short bool) {
	k := borrowKey{g, tenant}
	m.mu.Lock()
	if f := m.borrows[k]; f != nil {
		m.mu.Unlock()
		select {
		case <-f.done:
			return f.got, f.busy
		case <-ctx.Done():
			return 0, true
		}
	}
	f := &flight{done: make(chan struct{})}
	m.borrows[k] = f
	m.mu.Unlock()

	t0 := time.Now()
	f.got, f.busy = m.borrow(ctx, g, tenant, need)
	m.metrics.Borrow(g, f.got, time.Since(t0))
	m.mu.Lock()
	delete(m.borrows, k)
	m.mu.Unlock()
	close(f.done)
	return f.got, f.busy
}

func (m *Mover) borrow(ctx context.Context, g int, tenant string, need int64) (got int64, short bool) {
	// Headroom this group gave away and its receiver does not have yet
	// is in transit: deliver it, so that its receiver can give it back.
	d0, _ := m.h.Module(g).Delta(tenant)
	moved, finished := m.finishAll(ctx, g, tenant)
	short = moved || !finished
	n := m.h.Groups()
	if n < 2 {
		return 0, short
	}
	// One giver first (in turn, to spread the load): most borrows need less
	// than one group's free headroom, and asking one keeps the headroom
	// where it is unused. What it cannot cover is asked of all the others
	// at once, so a large request takes two round trips, not G−1.
	m.mu.Lock()
	m.turn++
	first := (g + 1 + int(m.turn%uint64(n-1))) % n
	m.mu.Unlock()
	got, short1 := m.borrowFrom(ctx, first, g, tenant, need)
	short = short || short1
	if got >= need {
		return got, short
	}
	gots := make([]int64, n)
	shorts := make([]bool, n)
	m.fanout(n, func(giver int) {
		if giver != g && giver != first {
			gots[giver], shorts[giver] = m.borrowFrom(ctx, giver, g, tenant, need-got)
		}
	})
	for i := range n {
		got += gots[i]
		short = short || shorts[i]
	}
	if d1, _ := m.h.Module(g).Delta(tenant); got == 0 && d1 > d0 {
		// A giver delivered a transfer that was in transit to this group
		// before it answered: that is headroom received too.
		got = d1 - d0
	}
	return got, short || (got == 0 && ctx.Err() != nil)
}

// borrowFrom asks one giver for up to need (it may give more: half its free
// headroom) and commits the receive in g.
func (m *Mover) borrowFrom(ctx context.Context, giver, g int, tenant string, need int64) (int64, bool) {
	cli, err := m.h.Peer(ctx, giver)
	if err != nil {
		m.log.Debug("borrow: no leader for giver", "group", giver, "err", err)
		return 0, true
	}
	resp, err := cli.Give(ctx, &api.GiveRequest{Tenant: tenant, Giver: uint32(giver), Receiver: uint32(g), Want: need})
	if err != nil {
		m.log.Debug("borrow: give failed", "giver", giver, "receiver", g, "err", err)
		return 0, true
	}
	if resp.Amount <= 0 && resp.Reason == ReasonOutstanding && m.h.Module(g).Received(tenant, giver, resp.Seq) {
		// The giver still waits for the Complete of an earlier transfer
		// this group already has: complete it now and ask again.
		if _, err := cli.Complete(ctx, &api.CompleteRequest{Tenant: tenant, Giver: uint32(giver), Seq: resp.Seq}); err == nil {
			resp, err = cli.Give(ctx, &api.GiveRequest{Tenant: tenant, Giver: uint32(giver), Receiver: uint32(g), Want: need})
			if err != nil {
				return 0, true
			}
		}
	}
	if resp.Amount <= 0 {
		return 0, resp.Reason == ReasonOutstanding || resp.Reason == ReasonInFlight
	}
	// The giver committed its reduction: the amount is in transit until
	// the receive commits. If this fails, the giver's re-drive loop
	// delivers it later.
	if _, err := m.receive(ctx, giver, g, tenant, resp.Seq, resp.Amount); err != nil {
		m.log.Warn("borrow: receive failed; the giver will re-drive it", "giver", giver, "receiver", g, "seq", resp.Seq, "err", err)
		return 0, true
	}
	m.metrics.Moved(giver, g, resp.Amount)
	m.spawn(func() { m.complete(giver, tenant, resp.Seq) })
	return resp.Amount, false
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
	// Headroom this group gave that its receivers may not have yet is
	// nobody's to use: deliver and complete it first (one transfer per
	// (giver, receiver) is outstanding at a time, and a receiver short of
	// what is in transit to it could refuse series below the limit).
	moved, finished := m.finishAll(ctx, giver, tenant)
	stuck := moved || !finished
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
		typ := shares.EntryGive
		if !mod.Known(receiver) {
			typ = shares.EntryGiveWide // a group a raise added (cluster version 7)
		}
		wait, aerr = m.h.Append(giver, typ, shares.AppendGive(nil, shares.Give{Tenant: tenant, To: receiver, Amount: amount, Nonce: nonce}))
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
		if inFlight || stuck {
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

// finishAll finishes every outstanding transfer of tenant from giver. moved
// reports that one reached its receiver only now (that group may have free
// headroom it did not have before); ok is false when one could not be
// finished (its receiver has no leader).
func (m *Mover) finishAll(ctx context.Context, giver int, tenant string) (moved, ok bool) {
	ok = true
	for _, o := range m.h.Module(giver).View(tenant).Outstanding {
		now, err := m.finish(ctx, giver, tenant, o.Seq)
		if err != nil {
			m.log.Debug("transfer not finished", "giver", giver, "receiver", o.To, "seq", o.Seq, "err", err)
			ok = false
		}
		moved = moved || now
	}
	return moved, ok
}

// finish delivers the giver's outstanding transfer seq of tenant to its
// receiver (a no-op there when it already has it) and completes it.
func (m *Mover) finish(ctx context.Context, giver int, tenant string, seq uint64) (delivered bool, err error) {
	var tr *shares.Transfer
	for _, o := range m.h.Module(giver).View(tenant).Outstanding {
		if o.Seq == seq {
			tr = &o
			break
		}
	}
	if tr == nil {
		return false, nil // completed meanwhile
	}
	cli, err := m.h.Peer(ctx, tr.To)
	if err != nil {
		return false, err
	}
	resp, err := cli.Receive(ctx, &api.ReceiveRequest{Tenant: tenant, Giver: uint32(giver), Receiver: uint32(tr.To), Seq: seq, Amount: tr.Amount})
	if err != nil {
		return false, err
	}
	if resp.AppliedNow {
		m.metrics.Recovered(giver, tr.To, tr.Amount)
	}
	_, err = m.Complete(ctx, tenant, giver, seq)
	return resp.AppliedNow, err
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
	typ := shares.EntryReceive
	if !m.h.Module(receiver).Known(giver) {
		typ = shares.EntryReceiveWide
	}
	res, err := m.h.Propose(ctx, receiver, typ, shares.AppendReceive(nil, shares.Receive{Tenant: tenant, From: giver, Seq: seq, Amount: amount}))
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

// Share is the admission share of a group from the tenant's limit, the
// group's base share of it, its committed delta and the headroom its leader
// promised to give entries in flight: 0 for an unlimited tenant, otherwise
// the positive remainder or limits.NoHeadroom. A group admits a new series
// only while its usage is below this share. The rule is limits.GroupShare's
// (limits.ShareOver: the base comes from Host.Base).
func Share(limit, base, delta, reservedOut int64) int64 {
	return limits.ShareOver(limit, base, delta, reservedOut)
}
