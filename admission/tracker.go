package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
)

// ErrNotLeader is returned by Track when this node does not lead the group, or
// stopped leading it before the request was decided: nothing was logged for the
// request, so redirecting it is safe.
var ErrNotLeader = errors.New("not the group leader")

// ErrStepDown is returned when the session ended after the request was decided:
// its entry may or may not commit, so the caller must retry. It wraps the raft
// error that ended the session when there was one.
var ErrStepDown = errors.New("leadership lost before commit")

// errUndecided answers a request that a session took but never decided (it
// stopped first): nothing was logged for it, so it may be sent again, to this
// node's next session or to another leader.
var errUndecided = fmt.Errorf("%w (request not decided)", ErrNotLeader)

// DefaultSessionWait bounds how long a request waits for a new session while
// raft still names this node leader (Config.SessionWait).
const DefaultSessionWait = time.Second

// barrierRetry is the pause between failed leader barriers.
const barrierRetry = 100 * time.Millisecond

// Config is the fixed configuration of one group's leader path.
type Config struct {
	Group int // for logs
	// IdleMinutes is the idle age: a series whose age in whole minutes is at
	// least this is idle (fsm.IdleAge of the configured timeout).
	IdleMinutes int
	// ExpireAge, when set, gives the idle age written into expire entries; nil:
	// IdleMinutes. It lets the server send an older value while some replica
	// cannot decode the new one (a rolling upgrade).
	ExpireAge      func() int
	BatchWindow    time.Duration // how long to gather while a batch is unanswered; 0: only what is already queued
	MaxBatchHashes int
	MaxInFlight    int // batches appended but not yet answered
	ApplyTimeout   time.Duration
	Clock          func() time.Time // nil: time.Now
	// Share returns the group's share of tenant's max series (0 = unlimited).
	// It is asked once per tenant per batch.
	Share func(tenant string) int64
	// Checks are consulted in order for every request that would create series
	// (see Check).
	Checks []Check
	// Fence, when set, is asked before each request is decided; a non-nil
	// error answers the request with it and nothing is decided or logged for
	// it. It runs under the session's append lock, the one AppendFenced
	// holds, so state AppendFenced changes is seen by every request decided
	// after the entry AppendFenced appends (a partition leaving the group:
	// docs/online-groups.md).
	Fence func(tenant string, hashes []uint64) error
	// SessionWait bounds how long a request waits for this node's next
	// session when the one it was given stops undecided (an append failed)
	// while raft still names this node leader. Without it such a leader
	// answers NotLeader naming itself until the new session's barrier
	// passes. 0: DefaultSessionWait; negative: no wait.
	SessionWait time.Duration
	Metrics     Metrics // nil: none
	Logger      *slog.Logger
}

// Tracker is the leader path of one group: while this node leads it, a session
// batches Track calls, decides them against committed + in-flight state, appends
// one log entry per batch and answers after commit.
type Tracker struct {
	cfg     Config
	state   State
	log     Log
	metrics Metrics
	logger  *slog.Logger

	mu      sync.Mutex
	leader  bool
	session *session      // nil when not leading
	last    *session      // the latest session started, running or not
	changed chan struct{} // closed and replaced whenever session or leader changes
}

// New returns a tracker that leads nothing until SetLeader(true).
func New(cfg Config, st State, lg Log) *Tracker {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Share == nil {
		cfg.Share = func(string) int64 { return 0 }
	}
	cfg.MaxBatchHashes = max(1, cfg.MaxBatchHashes)
	if cfg.SessionWait == 0 {
		cfg.SessionWait = DefaultSessionWait
	}
	t := &Tracker{cfg: cfg, state: st, log: lg, metrics: cfg.Metrics, logger: cfg.Logger, changed: make(chan struct{})}
	if t.metrics == nil {
		t.metrics = noMetrics{}
	}
	if t.logger == nil {
		t.logger = slog.New(slog.DiscardHandler)
	}
	t.logger = t.logger.With("group", cfg.Group)
	return t
}

// SetLeader starts or stops the leader session; called on every leadership
// change of the group.
func (t *Tracker) SetLeader(leader bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.notifyLocked()
	t.leader = leader
	if leader && t.session == nil {
		t.startLocked()
		return
	}
	if !leader && t.session != nil {
		s := t.session
		t.session = nil
		s.stop()
	}
}

func (t *Tracker) startLocked() {
	s := newSession(t, t.last)
	t.session, t.last = s, s
	go s.run()
}

// notifyLocked wakes requests waiting for a session change.
func (t *Tracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// ended is called by a session that stopped on its own (an append failed) or
// was stopped. If raft still names this node leader, a fresh session takes over:
// without it, a transient failure such as an enqueue timeout would leave a
// leader that answers NotLeader until the next election.
func (t *Tracker) ended(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.session == s {
		t.session = nil
		if t.leader {
			t.logger.Info("leader session ended while leading; starting a new one")
			t.startLocked()
		}
		t.notifyLocked()
	}
}

func (t *Tracker) current() *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.session
}

// Leading reports whether a leader session exists (it may still be running
// its barrier, or have failed and be about to be replaced).
func (t *Tracker) Leading() bool { return t.current() != nil }

// Ready reports whether this node leads the group and has applied every entry
// of earlier terms, so its decisions see the whole committed state. A session
// whose append failed is not ready; its successor is once its barrier passed.
func (t *Tracker) Ready() bool {
	s := t.current()
	return s != nil && s.barrierDone.Load() && !s.failed.Load()
}

// Exclusive runs fn while this node leads the group with a ready session and
// no batch is being decided: every batch decided so far has its new series
// reserved in State.TenantUsage, and no batch is decided until fn returns. A
// caller that lowers a share (a headroom give) reads the usage and takes its
// own reservation inside fn, so no series can be admitted into headroom that
// is being given away. fn must be short and must not wait on the log. It
// returns ErrNotLeader without calling fn when no ready session exists.
func (t *Tracker) Exclusive(fn func() error) error {
	s := t.current()
	if s == nil || !s.barrierDone.Load() || s.failed.Load() {
		return ErrNotLeader
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	select {
	case <-s.stopped:
		return ErrNotLeader
	default:
	}
	return fn()
}

// AppendFenced appends data to the group's log while this node leads it with
// a ready session, ordered with the session's decisions, and waits until the
// entry applied (or failed), returning the FSM's response. No batch is
// between its decision and its append while fn runs and data is appended,
// so every batch decided before fn is in the log before data, and every
// batch decided after it sees what fn changed through Config.Fence. And no
// batch is decided, nor an Exclusive caller run, until the entry applied: an
// entry that changes a tenant's usage and share together (a partition
// hand-off) is never seen half applied by a decision. fn must be quick. It
// returns ErrNotLeader without calling fn when no ready session exists, and
// fn's error without appending.
func (t *Tracker) AppendFenced(fn func() error, data []byte) (any, error) {
	s := t.current()
	if s == nil || !s.barrierDone.Load() || s.failed.Load() {
		return nil, ErrNotLeader
	}
	s.amu.Lock()
	defer s.amu.Unlock()
	s.pmu.Lock()
	defer s.pmu.Unlock()
	select {
	case <-s.stopped:
		return nil, ErrNotLeader
	default:
	}
	if fn != nil {
		if err := fn(); err != nil {
			return nil, err
		}
	}
	fut := t.log.Apply(data, t.cfg.ApplyTimeout)
	if err := fut.Error(); err != nil {
		return nil, stepDown(err)
	}
	return fut.Response(), nil
}

// Track submits one request of tenant and waits for its decision and commit. It
// returns the rejected hashes; every other hash is active once it returns nil.
func (t *Tracker) Track(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	rejected, _, err := t.TrackAtShare(ctx, tenant, hashes)
	return rejected, err
}

// TrackAtShare is Track that also returns how many of the rejected hashes were
// rejected only because the group's share was used up (no Check refused them).
//
// A request that a session stopped before deciding (nothing logged) is sent
// again to the next session while raft still names this node leader, for up
// to SessionWait: a leader replacing its session after a failed append does
// not answer NotLeader about itself. Only ErrNotLeader answers are retried;
// a decided request keeps its answer (ErrStepDown when its entry may or may
// not have committed).
func (t *Tracker) TrackAtShare(ctx context.Context, tenant string, hashes []uint64) ([]uint64, int, error) {
	var tried *session
	var deadline time.Time
	for {
		t.mu.Lock()
		s, leader, changed := t.session, t.leader, t.changed
		t.mu.Unlock()
		if s != nil && s != tried {
			rej, atShare, err := s.track(ctx, tenant, hashes)
			if !errors.Is(err, errUndecided) {
				return rej, atShare, err
			}
			tried = s
			continue // see whether a successor is already there
		}
		// No session, or the one that gave up on this request is still the
		// current one (it is stopping): wait for its successor.
		if !leader || t.cfg.SessionWait < 0 {
			return nil, 0, ErrNotLeader
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(t.cfg.SessionWait)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return nil, 0, ErrNotLeader
		}
		timer := time.NewTimer(wait)
		select {
		case <-changed:
			timer.Stop()
		case <-timer.C:
			return nil, 0, ErrNotLeader
		case <-ctx.Done():
			timer.Stop()
			return nil, 0, ctx.Err()
		}
	}
}

// track submits one request to this session and waits for its answer.
// errUndecided means the session stopped before deciding it.
func (s *session) track(ctx context.Context, tenant string, hashes []uint64) ([]uint64, int, error) {
	r := &request{ctx: ctx, tenant: tenant, hashes: hashes, done: make(chan result, 1)}
	select {
	case s.reqCh <- r:
	case <-s.stopped:
		return nil, 0, errUndecided
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	select {
	case res := <-r.done:
		return res.rejected, res.atShare, res.err
	case <-s.finished:
		// The session answered everything it decided. If r is not answered it
		// was never decided, so nothing was logged for it.
		select {
		case res := <-r.done:
			return res.rejected, res.atShare, res.err
		default:
			return nil, 0, errUndecided
		}
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

type request struct {
	ctx    context.Context
	tenant string
	hashes []uint64
	done   chan result // buffered(1)
}

type result struct {
	rejected []uint64
	atShare  int
	err      error
}

// session lives for one leadership term (or until an append fails).
type session struct {
	t           *Tracker
	prev        *session // the session this one follows, nil for the first
	reqCh       chan *request
	stopCh      chan struct{}
	stopped     chan struct{} // closed when the session stops deciding and appending
	finished    chan struct{} // closed when every accepted request was answered
	stopOnce    sync.Once
	barrierDone atomic.Bool
	failed      atomic.Bool

	inflight chan *batch
	// unanswered counts the batches handed to the completer and not yet
	// answered: gather waits for a batch window only while there are some.
	unanswered atomic.Int32

	// decider-goroutine state
	lastStamp  int64
	lastExpire int64
	states     []uint8
	in         []Request

	// amu orders appends: the decider holds it from deciding a batch until
	// its entry is appended, AppendFenced while it changes what Fence sees
	// and appends its own entry.
	amu sync.Mutex

	// pending is read and written under pmu by the decider and the completer.
	// Decide holds pmu across the committed-state lookup and the pending check,
	// so a hash is either seen applied or still seen pending, never neither.
	pmu     sync.Mutex
	pending *Pending
	// batchesWith counts, per tenant, the batches in flight that logged new
	// series of it (under pmu). When the last of them completes, nothing of
	// the tenant is pending: with many tenants its table is dropped
	// (Pending.forget).
	batchesWith map[string]int
}

type batch struct {
	fut    ApplyFuture // nil when the batch logged nothing
	reqs   []*request
	res    []result
	newBy  map[string][]uint64 // hashes logged as new, per tenant
	seq    uint64              // the batch's number in pending (Pending.Done)
	start  time.Time
	expire bool
	done   chan struct{} // closed by the completer when set (someone waits for it)
}

func newSession(t *Tracker, prev *session) *session {
	return &session{
		t:        t,
		prev:     prev,
		reqCh:    make(chan *request, 4096),
		stopCh:   make(chan struct{}),
		stopped:  make(chan struct{}),
		finished: make(chan struct{}),
		inflight: make(chan *batch, max(1, t.cfg.MaxInFlight)),
		pending:  NewPending(),

		batchesWith: map[string]int{},
	}
}

func (s *session) stop() { s.stopOnce.Do(func() { close(s.stopCh) }) }

func (s *session) run() {
	t := s.t
	completerDone := make(chan struct{})
	go func() {
		defer close(completerDone)
		s.complete()
	}()
	defer func() {
		close(s.stopped)
		// Requests queued but never decided get NotLeader: nothing was logged.
		for {
			select {
			case r := <-s.reqCh:
				r.done <- result{err: errUndecided}
				continue
			default:
			}
			break
		}
		close(s.inflight)
		<-completerDone
		close(s.finished)
		t.ended(s)
	}()

	// A session may follow another in the same term (an admin restore paused
	// it, or an append failed): it must not reset the reservations of entries
	// its predecessor may still append.
	if s.prev != nil {
		select {
		case <-s.prev.stopped:
		case <-s.stopCh:
			return
		}
		s.prev = nil // no chain of ended sessions kept alive
	}
	// Apply everything committed in earlier terms before deciding anything: a new
	// leader's FSM may lag the commit index, and deciding against a stale state
	// could reject an accepted series.
	for {
		err := t.log.Barrier(t.cfg.ApplyTimeout).Error()
		if err == nil {
			break
		}
		t.logger.Warn("leader barrier failed; retrying", "err", err)
		select {
		case <-s.stopCh:
			return
		case <-time.After(barrierRetry):
		}
	}
	s.lastExpire = t.state.Now()
	t.state.ResetReservations()
	// Ready only now: an Exclusive caller's reservation must not be dropped
	// by the reset above.
	s.barrierDone.Store(true)
	t.logger.Info("leading group", "applied_index", t.state.AppliedIndex())

	// A new minute is stamped within a quarter second of its start, so the
	// followers' group clocks observe minute boundaries closely.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	window := time.NewTimer(time.Hour)
	window.Stop()
	var reqs []*request
	for {
		select {
		case <-s.stopCh:
			return
		case <-tick.C:
			if !s.maybeExpire() {
				return
			}
		case r := <-s.reqCh:
			reqs = append(reqs[:0], r)
			var ok bool
			if reqs, ok = s.gather(reqs, window); !ok {
				return
			}
			if !s.maybeExpire() || !s.decideAndLog(reqs) {
				return
			}
		}
	}
}

// gather adds queued requests to reqs until the batch holds MaxBatchHashes.
// While an earlier batch is unanswered (its entry is being appended and
// applied) it waits up to the batch window for more, since the next entry
// cannot commit before that one anyway; otherwise, and without a window, it
// takes only what is already queued. An idle leader so appends a request at
// once: a timer there delays it by the window rounded up to the runtime's
// timer resolution when idle, about a millisecond on Linux, and gathers
// nothing (measured in BENCHMARKS.md). It returns false when the session
// stopped while waiting; the gathered requests were then answered NotLeader
// (nothing logged).
func (s *session) gather(reqs []*request, window *time.Timer) ([]*request, bool) {
	n := 0
	for _, r := range reqs {
		n += len(r.hashes)
	}
	var expired <-chan time.Time
	if w := s.t.cfg.BatchWindow; w > 0 && s.unanswered.Load() > 0 {
		window.Reset(w)
		defer window.Stop()
		expired = window.C
	}
	for n < s.t.cfg.MaxBatchHashes {
		var r *request
		if expired == nil {
			select {
			case r = <-s.reqCh:
			default:
				return reqs, true
			}
		} else {
			select {
			case r = <-s.reqCh:
			case <-expired:
				return reqs, true
			case <-s.stopCh:
				for _, r := range reqs {
					r.done <- result{err: errUndecided}
				}
				return reqs, false
			}
		}
		reqs = append(reqs, r)
		n += len(r.hashes)
	}
	return reqs, true
}

// now is the Unix minute to stamp: the leader's clock, never behind what the FSM
// has applied or what this session already stamped (clocks may differ between
// leaders; the log's time must not go backwards).
func (s *session) now() int64 {
	wall := s.t.cfg.Clock().Unix() / 60
	return max(wall, s.t.state.Now(), s.lastStamp)
}

// maybeExpire appends an expire entry when the minute advanced. It returns false
// when the session must end.
func (s *session) maybeExpire() bool {
	now := s.now()
	if now <= s.lastExpire {
		return true
	}
	t := s.t
	// After a long pause (no leader, stalled clock) the committed state may still
	// hold series that are idle now; decisions read committed state, so let this
	// expiry apply first instead of judging those series active.
	longGap := now-t.state.Now() >= int64(t.cfg.IdleMinutes)
	age := t.cfg.IdleMinutes
	if t.cfg.ExpireAge != nil {
		age = t.cfg.ExpireAge()
	}
	data := fsm.AppendExpire(nil, now, age)
	b := &batch{fut: t.log.Apply(data, t.cfg.ApplyTimeout), start: time.Now(), expire: true}
	if longGap {
		b.done = make(chan struct{})
	}
	s.lastExpire, s.lastStamp = now, now
	if !s.enqueue(b) {
		return false
	}
	if longGap {
		// Wait through the completer: a raft future is not safe for two waiters.
		select {
		case <-b.done:
		case <-s.stopCh:
			return false
		}
		return !s.failed.Load()
	}
	return true
}

func (s *session) enqueue(b *batch) bool {
	s.unanswered.Add(1) // before the completer can see b
	select {
	case s.inflight <- b:
		return true
	case <-s.stopCh:
		s.unanswered.Add(-1)
		// The entry may still commit; its requests get the step-down error.
		s.failBatch(b, ErrStepDown)
		return false
	}
}

func (s *session) budget(tenant string) Budget {
	active, reserved := s.t.state.TenantUsage(tenant)
	return Budget{Share: s.t.cfg.Share(tenant), Used: active + reserved}
}

// decideAndLog decides a batch (Decide) and appends one entry for it.
func (s *session) decideAndLog(reqs []*request) bool {
	t := s.t
	now := s.now()
	s.lastStamp = now

	b := &batch{reqs: append([]*request(nil), reqs...), res: make([]result, len(reqs)), start: time.Now()}
	total := 0
	for _, r := range reqs {
		total += len(r.hashes)
	}
	if cap(s.states) < total {
		s.states = make([]uint8, total)
	}
	in := s.in[:0]
	off := 0

	s.amu.Lock()
	s.pmu.Lock()
	for i, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			b.res[i].err = err
			in = append(in, Request{Tenant: r.tenant}) // no hashes: nothing decided
			continue
		}
		if t.cfg.Fence != nil {
			if err := t.cfg.Fence(r.tenant, r.hashes); err != nil {
				b.res[i].err = err
				in = append(in, Request{Tenant: r.tenant})
				continue
			}
		}
		st := s.states[off : off+len(r.hashes)]
		off += len(r.hashes)
		t.state.Lookup(r.tenant, r.hashes, now, t.cfg.IdleMinutes, st)
		in = append(in, Request{Tenant: r.tenant, Hashes: r.hashes, States: st})
	}
	d := Decide(in, s.pending, s.budget, t.cfg.Checks)
	// Reserve before appending (the entry may apply before Apply returns) and
	// before releasing pmu: Exclusive callers then see every decided new
	// series in the tenant's usage.
	for _, th := range d.Entry {
		if th.New > 0 {
			t.state.Reserve(th.Tenant, int64(th.New))
		}
	}
	for tenant := range d.NewBy {
		s.batchesWith[tenant]++
	}
	s.pmu.Unlock()
	clear(in) // drop references to the callers' hashes
	s.in = in[:0]

	for i := range b.res {
		if b.res[i].err == nil {
			b.res[i].rejected = d.Rejected[i]
			b.res[i].atShare = d.AtShare[i]
		}
	}
	b.newBy, b.seq = d.NewBy, d.Seq
	t.metrics.SeriesDecided(d.Created, d.Refreshed, d.RejectedN)
	if len(d.Entry) > 0 {
		logged := 0
		for _, th := range d.Entry {
			logged += len(th.Hashes)
		}
		data := fsm.AppendTrack(make([]byte, 0, 16+logged*8+len(d.Entry)*32), now, d.Entry)
		b.fut = t.log.Apply(data, t.cfg.ApplyTimeout)
		t.metrics.EntryAppended(len(data), logged)
	}
	s.amu.Unlock()
	return s.enqueue(b)
}

// complete waits for batches in log order and answers their requests. Order
// matters: a batch that logged nothing may depend on hashes created by an earlier
// in-flight batch, so it is answered only after every earlier batch committed.
func (s *session) complete() {
	t := s.t
	for b := range s.inflight {
		var err error
		if b.fut != nil {
			err = b.fut.Error()
			if err == nil {
				if resp, ok := b.fut.Response().(error); ok && resp != nil {
					err = fmt.Errorf("apply: %w", resp)
				}
			}
			t.metrics.CommitLatency(time.Since(b.start))
		}
		if err != nil {
			t.logger.Warn("raft apply failed; ending this leader session", "err", err)
			s.failed.Store(true)
			s.stop()
		}
		if s.failed.Load() && err == nil {
			err = ErrStepDown
		}
		s.clearPending(b)
		s.unanswered.Add(-1)
		if b.done != nil {
			close(b.done)
		}
		if err != nil {
			s.failBatch(b, stepDown(err))
			continue
		}
		for i, r := range b.reqs {
			r.done <- b.res[i]
		}
	}
}

func (s *session) clearPending(b *batch) {
	if len(b.newBy) == 0 {
		// It added nothing to pending (a refresh-only batch): no lock on
		// the refresh path. Done is a maximum, so the next batch that did
		// add covers this one's number too.
		return
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.pending.Done(b.seq) // its hashes are no longer pending: no work per hash
	for tenant := range b.newBy {
		if n := s.batchesWith[tenant]; n > 1 {
			s.batchesWith[tenant] = n - 1
			continue
		}
		delete(s.batchesWith, tenant)
		s.pending.forget(tenant)
	}
}

func (s *session) failBatch(b *batch, err error) {
	for i, r := range b.reqs {
		if b.res != nil && b.res[i].err != nil {
			r.done <- b.res[i]
			continue
		}
		r.done <- result{err: err}
	}
}

// stepDown marks the raft errors that mean this node no longer leads (or raft
// stopped) as ErrStepDown, keeping the raft error in the chain. Other errors
// (an enqueue timeout, an FSM refusing an entry) are returned as they are; the
// server's error table maps each to a gRPC code.
func stepDown(err error) error {
	switch {
	case errors.Is(err, ErrStepDown):
		return err
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrStepDown, err)
	}
	return err
}
