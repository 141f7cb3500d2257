package partitionlimit

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/api"
)

// Series is one partition's part of a request: the hashes of the series the
// request writes to that ingest partition.
type Series struct {
	Partition int32
	Hashes    []uint64
}

// Limiter enforces max_series_per_partition. It is safe for concurrent use;
// requests of one tenant are serialised (one lock per tenant).
type Limiter struct {
	cfg   Config
	p     uint8
	m     uint32
	slots int64 // WindowMinutes+1: the window plus one minute of a node's clock ahead

	mu      sync.RWMutex
	tenants map[string]*tenantState

	st     counters
	sy     *syncer     // nil when Addrs is empty
	resend atomic.Bool // push every in-window sketch at the next interval

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// tenantState holds one tenant's partitions. Its lock covers everything below
// it, including the scratch buffers Check reuses so the steady state does not
// allocate.
type tenantState struct {
	name  string
	mu    sync.Mutex
	parts map[int32]*partState
	dirty bool // some minute sketch has local changes not yet pushed
	undo  []undoEntry
	pos   []uint32 // per hash of the request: index<<6 | value
	limit int64    // limit seen by the last Check (for status)
	// checked: Check was called for the tenant here, so the watch stream
	// subscribes to its sketches (a tenant known only from a batch is not).
	checked atomic.Bool
}

type undoEntry struct {
	ps  *partState
	idx uint32
	old uint8
}

// partState is one (tenant, partition): the minute sketches of the window in
// a ring indexed by minute mod slots, and their register-wise maximum (win)
// with the histogram of win's values, updated as registers rise.
type partState struct {
	minutes []minuteSketch
	win     []uint8
	hist    api.HLLHistogram
	head    int64 // the latest "now" minute this partition was advanced to
}

type minuteSketch struct {
	minute int64   // Unix minute held; 0 = slot unused
	regs   []uint8 // nil until first written
	// Registers raised locally since the last successful push; all = push
	// every register (a dense push failed, or too many changed to list).
	changed     []uint32
	changedBits []uint64
	all         bool
}

// New validates cfg and returns a Limiter. With cfg.Addrs set it starts
// pushing and watching sketches in the background; Close stops it.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Limiter{
		cfg:     cfg,
		p:       uint8(cfg.Precision),
		m:       uint32(1) << cfg.Precision,
		slots:   int64(cfg.WindowMinutes) + 1,
		tenants: map[string]*tenantState{},
		stop:    make(chan struct{}),
	}
	if len(cfg.Addrs) > 0 {
		sy, err := newSyncer(l)
		if err != nil {
			return nil, err
		}
		l.sy = sy
		l.wg.Add(2)
		go func() { defer l.wg.Done(); sy.pushLoop() }()
		go func() { defer l.wg.Done(); sy.watchLoop() }()
	}
	return l, nil
}

// Close stops the background loops and closes the connections. Check keeps
// working (locally) after Close.
func (l *Limiter) Close() error {
	l.once.Do(func() {
		close(l.stop)
		if l.sy != nil {
			l.sy.cancelWatch()
		}
		l.wg.Wait()
		if l.sy != nil {
			l.sy.close()
		}
	})
	return nil
}

func (l *Limiter) minute() int64 { return l.cfg.Clock().Unix() / 60 }

// Check decides a request of tenant writing series to the given partitions.
// It returns nil and records the hashes when, for every partition, the
// estimated distinct series of (window ∪ request) stay within the tenant's
// max_series_per_partition; otherwise it returns a *LimitError for the first
// partition over its limit and records nothing. Tenants without a limit pass
// untracked. A partition may appear more than once.
func (l *Limiter) Check(tenant string, req []Series) error {
	limit := int64(0)
	if l.cfg.Limits != nil {
		limit = l.cfg.Limits.MaxSeriesPerPartition(tenant)
	}
	l.st.checks.Add(1)
	if limit <= 0 {
		l.st.unlimited.Add(1)
		return nil
	}
	for i := range req {
		if p := req[i].Partition; p < 0 || int64(p) >= int64(l.cfg.Partitions) {
			l.st.rejectedInvalid.Add(1)
			return fmt.Errorf("%w: partition %d out of range [0, %d)", ErrInvalidRequest, p, l.cfg.Partitions)
		}
	}
	ts, err := l.tenant(tenant)
	if err != nil {
		l.st.rejectedInvalid.Add(1)
		return err
	}
	if !ts.checked.Load() && ts.checked.CompareAndSwap(false, true) && l.sy != nil {
		l.sy.resubscribe()
	}
	now := l.minute()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.limit = limit
	ts.undo = ts.undo[:0]
	ts.pos = ts.pos[:0]
	for i := range req {
		ps := ts.part(l, req[i].Partition)
		ps.advance(l, now)
		for _, h := range req[i].Hashes {
			idx, v := api.HLLPos(api.MixHash(h), l.p)
			ts.pos = append(ts.pos, api.HLLSparseEntry(idx, v))
			if old := ps.win[idx]; v > old {
				ts.undo = append(ts.undo, undoEntry{ps, idx, old})
				ps.hist.Raise(old, v)
				ps.win[idx] = v
			}
		}
		if est := api.HLLEstimate(&ps.hist, l.p); est > float64(limit) {
			for j := len(ts.undo) - 1; j >= 0; j-- {
				u := ts.undo[j]
				u.ps.hist.Raise(u.ps.win[u.idx], u.old)
				u.ps.win[u.idx] = u.old
			}
			l.st.rejectedLimit.Add(1)
			return &LimitError{Tenant: tenant, Partition: req[i].Partition, Limit: limit, Estimate: uint64(math.Round(est)), Window: l.cfg.WindowMinutes}
		}
	}
	// Every partition is within its limit: the hashes join the current minute.
	k := 0
	for i := range req {
		ms := ts.parts[req[i].Partition].slot(l, now)
		for range req[i].Hashes {
			idx, v := api.HLLSparseSplit(ts.pos[k])
			k++
			if v > ms.regs[idx] {
				ms.regs[idx] = v
				ms.markChanged(idx)
			}
		}
	}
	ts.dirty = true
	l.st.accepted.Add(1)
	return nil
}

// Estimate returns the estimated distinct series of tenant in partition over
// the window, as Check sees it now (local and received sketches).
func (l *Limiter) Estimate(tenant string, partition int32) float64 {
	l.mu.RLock()
	ts := l.tenants[tenant]
	l.mu.RUnlock()
	if ts == nil {
		return 0
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ps := ts.parts[partition]
	if ps == nil {
		return 0
	}
	ps.advance(l, l.minute())
	return api.HLLEstimate(&ps.hist, l.p)
}

// WindowRegisters returns a copy of the window sketch's registers of (tenant,
// partition) (nil when it holds nothing): tests and tools compare clients'
// views with it.
func (l *Limiter) WindowRegisters(tenant string, partition int32) []uint8 {
	l.mu.RLock()
	ts := l.tenants[tenant]
	l.mu.RUnlock()
	if ts == nil {
		return nil
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ps := ts.parts[partition]
	if ps == nil {
		return nil
	}
	ps.advance(l, l.minute())
	return append([]uint8(nil), ps.win...)
}

func (l *Limiter) tenant(name string) (*tenantState, error) {
	l.mu.RLock()
	ts := l.tenants[name]
	l.mu.RUnlock()
	if ts != nil {
		return ts, nil
	}
	if err := api.ValidateTenantID(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ts = l.tenants[name]; ts == nil {
		ts = &tenantState{name: name, parts: map[int32]*partState{}}
		l.tenants[name] = ts
	}
	return ts, nil
}

// part returns (creating) the partition's state; ts.mu held.
func (ts *tenantState) part(l *Limiter, p int32) *partState {
	if ps := ts.parts[p]; ps != nil {
		return ps
	}
	ps := &partState{minutes: make([]minuteSketch, l.slots), win: make([]uint8, l.m)}
	ps.hist.Reset(l.m)
	ts.parts[p] = ps
	return ps
}

// inWindow reports whether a minute sketch counts at "now": the last
// WindowMinutes minutes, and one minute ahead (a node's clock may lead ours).
func (l *Limiter) inWindow(minute, now int64) bool {
	return minute > now-int64(l.cfg.WindowMinutes) && minute <= now+1
}

// advance drops the minute sketches that left the window at now and, if any
// did, rebuilds win and its histogram from the rest: O(window × m) once per
// minute per partition, never per request.
func (ps *partState) advance(l *Limiter, now int64) {
	if now <= ps.head {
		return
	}
	ps.head = now
	dropped := false
	for i := range ps.minutes {
		ms := &ps.minutes[i]
		if ms.minute != 0 && !l.inWindow(ms.minute, now) {
			ms.reset(0)
			dropped = true
		}
	}
	if !dropped {
		return
	}
	clear(ps.win)
	for i := range ps.minutes {
		if regs := ps.minutes[i].regs; ps.minutes[i].minute != 0 {
			for j, v := range regs {
				ps.win[j] = max(ps.win[j], v)
			}
		}
	}
	ps.hist = api.HLLHistogram{}
	for _, v := range ps.win {
		ps.hist[v]++
	}
}

// slot returns the minute sketch for minute (inside the window), reusing the
// ring slot of a minute that left it.
func (ps *partState) slot(l *Limiter, minute int64) *minuteSketch {
	ms := &ps.minutes[((minute%l.slots)+l.slots)%l.slots]
	if ms.minute != minute {
		ms.reset(minute)
	}
	if ms.regs == nil {
		ms.regs = make([]uint8, l.m)
		ms.changedBits = make([]uint64, (l.m+63)/64)
	}
	return ms
}

func (ms *minuteSketch) reset(minute int64) {
	ms.minute = minute
	clear(ms.regs)
	clear(ms.changedBits)
	ms.changed = ms.changed[:0]
	ms.all = false
}

func (ms *minuteSketch) markChanged(idx uint32) {
	if ms.all {
		return
	}
	w, b := idx/64, uint64(1)<<(idx%64)
	if ms.changedBits[w]&b != 0 {
		return
	}
	ms.changedBits[w] |= b
	// Past a quarter of the registers a dense push is smaller than the list.
	if len(ms.changed) >= len(ms.regs)/4 {
		ms.all = true
		return
	}
	ms.changed = append(ms.changed, idx)
}

// mergeRemote merges one sketch received from a node; the sketch passed
// validation. Minutes outside the window are ignored (the node's clock may
// differ by a few seconds around a minute boundary).
func (l *Limiter) mergeRemote(ts *tenantState, partition int32, minute int64, s *api.Sketch, now int64) bool {
	ps := ts.part(l, partition)
	ps.advance(l, now)
	if !l.inWindow(minute, now) {
		return false
	}
	ms := ps.slot(l, minute)
	api.ForEachSketchRegister(s, func(idx uint32, v uint8) {
		if v > ms.regs[idx] {
			ms.regs[idx] = v
		}
		if old := ps.win[idx]; v > old {
			ps.hist.Raise(old, v)
			ps.win[idx] = v
		}
	})
	return true
}

// Rotate drops minutes that left the window for every partition. The
// background loop calls it every push interval so that Check rarely pays for
// a minute boundary; Check advances lazily too, so calling Rotate is optional.
func (l *Limiter) Rotate() {
	now := l.minute()
	for _, ts := range l.tenantList() {
		ts.mu.Lock()
		for _, ps := range ts.parts {
			ps.advance(l, now)
		}
		ts.mu.Unlock()
	}
}

// subscribed lists the tenants checked here, sorted: what the watch stream
// follows.
func (l *Limiter) subscribed() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []string
	for name, ts := range l.tenants {
		if ts.checked.Load() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (l *Limiter) tenantList() []*tenantState {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]*tenantState, 0, len(l.tenants))
	for _, ts := range l.tenants {
		out = append(out, ts)
	}
	return out
}

type counters struct {
	checks, unlimited, accepted, rejectedLimit, rejectedInvalid     atomic.Uint64
	pushes, pushFailures, pushRejected, bytesPushed, sketchesPushed atomic.Uint64
	batchesReceived, sketchesReceived, bytesReceived, badReceived   atomic.Uint64
	watchReconnects, resends                                        atomic.Uint64
	remoteOK, watching                                              atomic.Bool
	lastPushUnixNano, lastReceiveUnixNano                           atomic.Int64
}
