package server

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

// errNotLeader is returned by groupTracker.track when this node does not lead the
// group (or stopped leading it before the request was decided).
var errNotLeader = errors.New("not the group leader")

// errLeaderStepDown is returned when leadership was lost after the request was
// logged: the entry may or may not commit, so the caller must retry.
var errLeaderStepDown = errors.New("leadership lost before commit")

type trackerConfig struct {
	Group             int
	PartitionsInGroup int
	Partitions        int
	IdleMinutes       int
	BatchWindow       time.Duration
	MaxBatchHashes    int
	MaxInFlight       int
	ApplyTimeout      time.Duration
	Clock             func() time.Time
}

// groupTracker is the leader path of one group: it batches TrackSeries requests,
// decides them against committed + in-flight state, appends one log entry per
// batch and answers after commit.
type groupTracker struct {
	cfg     trackerConfig
	fsm     *fsm.FSM
	raft    *raft.Raft
	limits  func() *Limits
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	session *leaderSession // nil when not leading
}

type trackReq struct {
	ctx    context.Context
	tenant string
	hashes []uint64
	done   chan trackResult // buffered(1)
}

type trackResult struct {
	rejected []uint64
	err      error
}

func newGroupTracker(cfg trackerConfig, f *fsm.FSM, r *raft.Raft, limits func() *Limits, log *slog.Logger, m *metrics) *groupTracker {
	return &groupTracker{cfg: cfg, fsm: f, raft: r, limits: limits, log: log.With("group", cfg.Group), metrics: m}
}

// setLeader starts or stops the leader session. Called on every leadership change.
func (g *groupTracker) setLeader(leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if leader && g.session == nil {
		s := newLeaderSession(g)
		g.session = s
		go s.run()
		return
	}
	if !leader && g.session != nil {
		s := g.session
		g.session = nil
		s.stop()
	}
}

func (g *groupTracker) current() *leaderSession {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.session
}

// ready reports whether this node leads the group and has applied every entry of
// earlier terms, so its decisions see the whole committed state.
func (g *groupTracker) ready() bool {
	s := g.current()
	return s != nil && s.barrierDone.Load()
}

// track submits a request and waits for its decision and commit.
func (g *groupTracker) track(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	s := g.current()
	if s == nil {
		return nil, errNotLeader
	}
	r := &trackReq{ctx: ctx, tenant: tenant, hashes: hashes, done: make(chan trackResult, 1)}
	select {
	case s.reqCh <- r:
	case <-s.stopped:
		return nil, errNotLeader
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case res := <-r.done:
		return res.rejected, res.err
	case <-s.finished:
		// The session ended; it answered everything it decided. If r is not
		// answered it was never decided, so nothing was logged for it.
		select {
		case res := <-r.done:
			return res.rejected, res.err
		default:
			return nil, errNotLeader
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// leaderSession lives for one leadership term of one group.
type leaderSession struct {
	g           *groupTracker
	reqCh       chan *trackReq
	stopCh      chan struct{}
	stopped     chan struct{} // closed when the session stops accepting requests
	finished    chan struct{} // closed when every accepted request was answered
	stopOnce    sync.Once
	barrierDone atomic.Bool

	inflight chan *batch

	// decider-goroutine state
	lastStamp  int64
	lastExpire int64
	states     []uint8

	// pending holds, per tenant, the hashes logged as new in entries not yet
	// applied (hash → number of such entries), so a re-send before the commit is
	// accepted without logging it again. Their count against the limit lives in
	// the FSM's reservation (fsm.Tenant), which the apply releases atomically.
	pmu     sync.Mutex
	pending map[string]map[uint64]int32
	failed  atomic.Bool
}

type batch struct {
	fut    raft.ApplyFuture // nil when the batch logged nothing
	reqs   []*trackReq
	res    []trackResult
	newBy  map[string][]uint64 // hashes logged as new, per tenant (to clear pending)
	start  time.Time
	expire bool
	done   chan struct{} // closed by the completer when set (someone waits for it)
}

func newLeaderSession(g *groupTracker) *leaderSession {
	return &leaderSession{
		g:        g,
		reqCh:    make(chan *trackReq, 4096),
		stopCh:   make(chan struct{}),
		stopped:  make(chan struct{}),
		finished: make(chan struct{}),
		inflight: make(chan *batch, max(1, g.cfg.MaxInFlight)),
		pending:  map[string]map[uint64]int32{},
	}
}

func (s *leaderSession) stop() { s.stopOnce.Do(func() { close(s.stopCh) }) }

func (s *leaderSession) run() {
	g := s.g
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
				r.done <- trackResult{err: errNotLeader}
				continue
			default:
			}
			break
		}
		close(s.inflight)
		<-completerDone
		close(s.finished)
	}()

	// Apply everything committed in earlier terms before deciding anything: a new
	// leader's FSM may lag the commit index, and deciding against a stale state
	// could reject an accepted series.
	for !s.barrierDone.Load() {
		err := g.raft.Barrier(g.cfg.ApplyTimeout).Error()
		if err == nil {
			s.barrierDone.Store(true)
			break
		}
		g.log.Warn("leader barrier failed; retrying", "err", err)
		select {
		case <-s.stopCh:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.lastExpire = g.fsm.Now()
	g.fsm.ResetReservations()
	g.log.Info("leading group", "applied_index", g.fsm.AppliedIndex())

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	window := time.NewTimer(time.Hour)
	window.Stop()
	var reqs []*trackReq
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
			n := len(r.hashes)
			if g.cfg.BatchWindow > 0 {
				window.Reset(g.cfg.BatchWindow)
			collect:
				for n < g.cfg.MaxBatchHashes {
					select {
					case r := <-s.reqCh:
						reqs = append(reqs, r)
						n += len(r.hashes)
					case <-window.C:
						break collect
					case <-s.stopCh:
						for _, r := range reqs {
							r.done <- trackResult{err: errNotLeader}
						}
						return
					}
				}
				window.Stop()
			} else {
			drain:
				for n < g.cfg.MaxBatchHashes {
					select {
					case r := <-s.reqCh:
						reqs = append(reqs, r)
						n += len(r.hashes)
					default:
						break drain
					}
				}
			}
			if !s.maybeExpire() || !s.decideAndLog(reqs) {
				return
			}
		}
	}
}

// now is the Unix minute to stamp: the leader's clock, never behind what the FSM
// has applied or what this session already stamped (clocks may differ between
// leaders; the log's time must not go backwards).
func (s *leaderSession) now() int64 {
	wall := s.g.cfg.Clock().Unix() / 60
	return max(wall, s.g.fsm.Now(), s.lastStamp)
}

// maybeExpire appends an expire entry when the minute advanced. It returns false
// when the session must end.
func (s *leaderSession) maybeExpire() bool {
	now := s.now()
	if now <= s.lastExpire {
		return true
	}
	g := s.g
	// After a long pause (no leader, stalled clock) the committed state may still
	// hold series that are idle now; decisions read committed state, so let this
	// expiry apply first instead of judging those series active.
	longGap := now-g.fsm.Now() >= int64(g.cfg.IdleMinutes)
	data := fsm.AppendExpire(nil, now, g.cfg.IdleMinutes)
	b := &batch{fut: g.raft.Apply(data, g.cfg.ApplyTimeout), start: time.Now(), expire: true}
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

func (s *leaderSession) enqueue(b *batch) bool {
	select {
	case s.inflight <- b:
		return true
	case <-s.stopCh:
		// The entry may still commit; its requests get the step-down error.
		s.failBatch(b, errLeaderStepDown)
		return false
	}
}

// decideAndLog applies SPEC §2 to every hash in request order and appends one
// entry for the batch.
func (s *leaderSession) decideAndLog(reqs []*trackReq) bool {
	g := s.g
	now := s.now()
	s.lastStamp = now
	limits := g.limits()
	idle := g.cfg.IdleMinutes

	b := &batch{reqs: append([]*trackReq(nil), reqs...), res: make([]trackResult, len(reqs)), start: time.Now()}
	type tenantBatch struct {
		share  int64
		used   int64 // active + reserved (exact: see fsm.Tenant) when the batch began
		newN   int64 // accepted as new in this batch
		logged []uint64
	}
	tenants := map[string]*tenantBatch{}
	var order []string
	created, refreshed, rejectedN := 0, 0, 0

	s.pmu.Lock()
	for i, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			b.res[i].err = err
			continue
		}
		tb := tenants[r.tenant]
		if tb == nil {
			active, reserved := g.fsm.TenantUsage(r.tenant)
			tb = &tenantBatch{
				share: GroupShare(limits.For(r.tenant).MaxSeries, g.cfg.PartitionsInGroup, g.cfg.Partitions),
				used:  active + reserved,
			}
			tenants[r.tenant] = tb
			order = append(order, r.tenant)
		}
		if cap(s.states) < len(r.hashes) {
			s.states = make([]uint8, len(r.hashes))
		}
		states := s.states[:len(r.hashes)]
		g.fsm.Lookup(r.tenant, r.hashes, now, idle, states)
		pt := s.pending[r.tenant]
		var rejected []uint64
		for j, h := range r.hashes {
			switch states[j] {
			case fsm.StateFresh:
				continue
			case fsm.StateActive:
				tb.logged = append(tb.logged, h)
				refreshed++
				continue
			}
			if pt != nil && pt[h] > 0 {
				continue // created by an in-flight entry; we reply after it commits
			}
			if tb.share > 0 && tb.used+tb.newN >= tb.share {
				rejected = append(rejected, h)
				rejectedN++
				continue
			}
			if pt == nil {
				pt = map[uint64]int32{}
				s.pending[r.tenant] = pt
			}
			pt[h]++
			if b.newBy == nil {
				b.newBy = map[string][]uint64{}
			}
			b.newBy[r.tenant] = append(b.newBy[r.tenant], h)
			tb.logged = append(tb.logged, h)
			tb.newN++
			created++
		}
		b.res[i].rejected = rejected
	}
	s.pmu.Unlock()

	g.metrics.seriesDecided(g.cfg.Group, created, refreshed, rejectedN)
	var ths []fsm.TenantHashes
	total := 0
	for _, t := range order {
		tb := tenants[t]
		if len(tb.logged) == 0 {
			continue
		}
		ths = append(ths, fsm.TenantHashes{Tenant: t, Hashes: tb.logged, New: int(tb.newN)})
		total += len(tb.logged)
	}
	if len(ths) > 0 {
		// Reserve before appending: the entry may apply before Apply returns.
		for _, th := range ths {
			if th.New > 0 {
				g.fsm.Reserve(th.Tenant, int64(th.New))
			}
		}
		data := fsm.AppendTrack(make([]byte, 0, 16+total*8+len(ths)*32), now, ths)
		b.fut = g.raft.Apply(data, g.cfg.ApplyTimeout)
		g.metrics.entryAppended(g.cfg.Group, len(data), total)
	}
	return s.enqueue(b)
}

// complete waits for batches in log order and answers their requests. Order
// matters: a batch that logged nothing may depend on hashes created by an earlier
// in-flight batch, so it is answered only after every earlier batch committed.
func (s *leaderSession) complete() {
	for b := range s.inflight {
		var err error
		if b.fut != nil {
			err = b.fut.Error()
			if err == nil {
				if resp, ok := b.fut.Response().(error); ok && resp != nil {
					err = fmt.Errorf("apply: %w", resp)
				}
			}
			s.g.metrics.commitLatency(s.g.cfg.Group, time.Since(b.start))
		}
		if err != nil {
			s.g.log.Warn("raft apply failed; stepping down this session", "err", err)
			s.failed.Store(true)
			s.stop()
		}
		if s.failed.Load() && err == nil {
			err = errLeaderStepDown
		}
		s.clearPending(b)
		if b.done != nil {
			close(b.done)
		}
		if err != nil {
			s.failBatch(b, mapApplyErr(err))
			continue
		}
		for i, r := range b.reqs {
			r.done <- b.res[i]
		}
	}
}

func (s *leaderSession) clearPending(b *batch) {
	if len(b.newBy) == 0 {
		return
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for t, hs := range b.newBy {
		pt := s.pending[t]
		for _, h := range hs {
			if c := pt[h]; c <= 1 {
				delete(pt, h)
			} else {
				pt[h] = c - 1
			}
		}
		if len(pt) == 0 {
			delete(s.pending, t)
		}
	}
}

func (s *leaderSession) failBatch(b *batch, err error) {
	for i, r := range b.reqs {
		if b.res != nil && b.res[i].err != nil {
			r.done <- b.res[i]
			continue
		}
		r.done <- trackResult{err: err}
	}
}

func mapApplyErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown),
		errors.Is(err, errLeaderStepDown):
		return fmt.Errorf("%w: %v", errLeaderStepDown, err)
	}
	return err
}
