package fsm

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm/seriesmap"
	"github.com/tollgate-io/tollgate/layout"
)

// DefaultIdleMinutes is the idle timeout the FSM assumes for self-expiry until an
// expire entry tells it the configured one.
const DefaultIdleMinutes = 20

// Config is the fixed layout of the group this FSM holds.
type Config struct {
	Partitions int // P of the cluster
	Groups     int // G of the cluster
	Shards     int // S, a power of two
	Group      int // which group this FSM replicates
	// Base is the group count the cluster's layout was created with (0:
	// Groups). Groups below it own their arithmetic range of Base groups;
	// groups added by raising the count (docs/online-groups.md) own no
	// partition (layout.GroupSpan), as the raised layout table says.
	Base   int
	Logger *slog.Logger
	// MaxClusterVersion is the highest cluster version this replica applies
	// (default and upper bound: CurrentClusterVersion). Entry types introduced
	// later are unknown to it and halt the group (see Apply). Set lower only to
	// behave like an older build (upgrade tests, the server's
	// TOLLGATE_MAX_CLUSTER_VERSION switch).
	MaxClusterVersion int
	// Modules are the application state machines this group carries beside
	// the series (see Module); each owns registry rows naming it.
	Modules []Module
	// OnMinute, when set, is called on the apply goroutine each time the
	// group's minute (Now) advances, with the new minute: the node's group
	// clock observes the group's time through it. It must be quick.
	OnMinute func(minute int64)
}

func (c *Config) validate() error {
	if err := layout.ValidateLayout(c.Partitions, c.Groups, c.Shards); err != nil {
		return fmt.Errorf("fsm config: %w", err)
	}
	if c.Group < 0 || c.Group >= c.Groups {
		return fmt.Errorf("fsm config: group %d outside [0, %d)", c.Group, c.Groups)
	}
	if c.Base == 0 {
		c.Base = c.Groups
	}
	if c.Base < 1 || c.Base > c.Groups {
		return fmt.Errorf("fsm config: base group count %d outside [1, groups=%d]", c.Base, c.Groups)
	}
	if c.MaxClusterVersion == 0 {
		c.MaxClusterVersion = CurrentClusterVersion
	}
	if c.MaxClusterVersion < 1 || c.MaxClusterVersion > CurrentClusterVersion {
		return fmt.Errorf("fsm config: max cluster version %d outside [1, %d]", c.MaxClusterVersion, CurrentClusterVersion)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Tenant is one tenant's registration in a group. Ids are dense and assigned in
// the order tenants first appear (in the log, a snapshot, or a leader's
// reservation); they never reach a snapshot, which lists tenants by name.
type Tenant struct {
	Name string
	id   uint32

	mu     sync.Mutex
	active int64 // replicated: series held
	// reserved is leader-local, never replicated: series this node logged as new
	// whose entries are not applied yet. Applying an entry moves its New count from
	// reserved to active under mu, so active+reserved is exact at every instant.
	reserved int64
}

// Active is the tenant's number of active series in this group.
func (t *Tenant) Active() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active
}

// Usage returns active series and this node's outstanding reservations.
func (t *Tenant) Usage() (active, reserved int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active, t.reserved
}

func (t *Tenant) addActive(n int64) {
	t.mu.Lock()
	t.active += n
	t.mu.Unlock()
}

type shard struct {
	mu     sync.RWMutex
	tables []*seriesmap.Table // by tenant id; nil when the tenant has no series here
	gens   []uint64           // snapshot generation each table was last written in
}

// FSM is one group's state machine. Apply, Snapshot and Restore are called by raft
// from one goroutine; the read methods (Lookup, Tenant, Stats…) may be called
// concurrently from any goroutine.
type FSM struct {
	cfg       Config
	shardMask uint64
	lo, hi    int

	shards []shard

	regMu   sync.RWMutex
	byName  map[string]*Tenant
	tenants []*Tenant

	now          atomic.Int64 // highest Unix minute stamped on an applied entry
	lastExpire   int64        // apply goroutine only
	idle         int          // apply goroutine only
	appliedIndex atomic.Uint64
	appliedTerm  atomic.Uint64

	snapGen   uint64 // apply goroutine only
	liveSnaps atomic.Int32

	modules     map[string]Module // by name; read-only after New
	moduleNames []string          // sorted

	// halt is set when an entry could not be applied (see Apply); nil while
	// the FSM applies normally.
	halt atomic.Pointer[haltState]

	// apply-goroutine scratch
	byShard [][]uint64
}

// New returns an empty FSM for one group.
func New(cfg Config) (*FSM, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f := &FSM{cfg: cfg, shardMask: uint64(cfg.Shards - 1), idle: DefaultIdleMinutes}
	f.lo, f.hi = layout.GroupSpan(cfg.Group, cfg.Partitions, cfg.Base)
	if err := f.setupModules(); err != nil {
		return nil, err
	}
	f.reset()
	return f, nil
}

func (f *FSM) reset() {
	f.shards = make([]shard, f.cfg.Shards)
	f.byName = map[string]*Tenant{}
	f.tenants = nil
	f.byShard = make([][]uint64, f.cfg.Shards)
}

// Config returns the layout this FSM was built with.
func (f *FSM) Config() Config { return f.cfg }

// PartitionRange returns the group's partitions [lo, hi).
func (f *FSM) PartitionRange() (lo, hi int) { return f.lo, f.hi }

// Now returns the highest Unix minute applied so far (0 before the first entry).
func (f *FSM) Now() int64 { return f.now.Load() }

// AppliedIndex returns the raft index of the last applied entry or restored snapshot.
func (f *FSM) AppliedIndex() uint64 { return f.appliedIndex.Load() }

// ErrHalted is wrapped by Apply's response and Snapshot's error while the FSM is
// halted.
var ErrHalted = errors.New("group halted")

type haltState struct {
	index  uint64 // raft index of the entry that could not be applied
	reason string
}

// Halted reports whether the FSM stopped applying, and why: which entry, which
// type, and the cluster version this replica supports.
func (f *FSM) Halted() (bool, string) {
	if h := f.halt.Load(); h != nil {
		return true, h.reason
	}
	return false, ""
}

// HaltedAt is the raft index of the entry the FSM could not apply (0 when not halted).
func (f *FSM) HaltedAt() uint64 {
	if h := f.halt.Load(); h != nil {
		return h.index
	}
	return 0
}

// Apply implements raft.FSM.
//
// An entry this replica cannot apply — a type it does not know (a newer
// cluster version), a checksum mismatch or a malformed payload — halts the
// FSM: it applies nothing more, the applied index stays before that entry, and
// Snapshot refuses, so raft keeps the whole log from there on. Skipping would
// be worse than stopping: replicas that can apply the entry would hold a
// different state, silently and forever. A restart with a build that knows the
// type replays the log from the last snapshot and converges. Every Apply while
// halted returns an error wrapping ErrHalted.
func (f *FSM) Apply(l *raft.Log) interface{} {
	if h := f.halt.Load(); h != nil {
		return fmt.Errorf("group %d: entry %d not applied: %w at index %d: %s", f.cfg.Group, l.Index, ErrHalted, h.index, h.reason)
	}
	if l.Type != raft.LogCommand {
		f.appliedIndex.Store(l.Index)
		f.appliedTerm.Store(l.Term)
		return nil
	}
	e, typ, err := decodeEntry(l.Data, f.cfg.MaxClusterVersion)
	if err != nil {
		f.haltAt(l.Index, typ, err)
		h := f.halt.Load()
		return fmt.Errorf("group %d: %w at index %d: %s", f.cfg.Group, ErrHalted, h.index, h.reason)
	}
	res, err := f.applyAt(&e, l.Index, l.Term)
	if err != nil {
		f.haltAt(l.Index, typ, err)
		h := f.halt.Load()
		return fmt.Errorf("group %d: %w at index %d: %s", f.cfg.Group, ErrHalted, h.index, h.reason)
	}
	f.appliedIndex.Store(l.Index)
	f.appliedTerm.Store(l.Term)
	return res
}

func (f *FSM) haltAt(index uint64, typ byte, err error) {
	var reason string
	switch {
	case errors.Is(err, ErrUnknownEntryType):
		name := "not known to this build"
		if info, ok := LookupEntryType(typ); ok {
			name = fmt.Sprintf("%s, introduced in cluster version %d", info.Name, info.Since)
		}
		reason = fmt.Sprintf("raft index %d has entry type %d (%s); this build supports cluster version %d: restart this node with a build that supports it, raft kept the log and it will be replayed",
			index, typ, name, f.cfg.MaxClusterVersion)
	default:
		reason = fmt.Sprintf("raft index %d cannot be decoded (%v); this build supports cluster version %d: the log entry is damaged or from an incompatible build; raft kept the log",
			index, err, f.cfg.MaxClusterVersion)
	}
	f.halt.Store(&haltState{index: index, reason: reason})
	f.cfg.Logger.Error("group halted: an entry cannot be applied; this replica applies nothing more until restarted with a build that can",
		"group", f.cfg.Group, "index", index, "type", typ, "supported_cluster_version", f.cfg.MaxClusterVersion, "err", err)
}

// ApplyEntry applies a decoded entry and returns what Apply would return for
// it. Exposed for tests and benchmarks that drive the FSM without raft; raft
// uses Apply. The entry's type must be registered.
func (f *FSM) ApplyEntry(e Entry) any {
	return f.applyEntry(&e)
}

func (f *FSM) applyEntry(e *Entry) any {
	res, err := f.applyAt(e, 0, 0)
	if err != nil {
		return err
	}
	return res
}

// applyAt applies a decoded entry of a registered type. An error (a module
// payload that does not decode, or no module for the type) halts the group
// when it comes from raft.
func (f *FSM) applyAt(e *Entry, index, term uint64) (any, error) {
	r := lookupType(e.Type)
	if r == nil {
		return nil, fmt.Errorf("group %d: %w: %d", f.cfg.Group, ErrUnknownEntryType, e.Type)
	}
	if r.module != "" {
		return f.applyModule(r, e, index, term)
	}
	return r.apply(f, e), nil
}

// advance moves the FSM clock to the entry's minute (never backwards) and
// returns the clock before and after.
func (f *FSM) advance(e *Entry) (prev, now int64) {
	prev = f.now.Load()
	now = max(e.Now, prev)
	if prev == 0 {
		prev = now
	}
	return prev, now
}

// setNow stores the group's minute and tells OnMinute when it advanced.
func (f *FSM) setNow(now int64) {
	if old := f.now.Swap(now); now > old && f.cfg.OnMinute != nil {
		f.cfg.OnMinute(now)
	}
}

func (f *FSM) applyExpire(e *Entry) any {
	prev, now := f.advance(e)
	f.idle = e.Idle
	f.expire(prev, now, e.Idle)
	f.setNow(now)
	return nil
}

func (f *FSM) applyTrack(e *Entry) any {
	prev, now := f.advance(e)
	// Keep every stored minute younger than the 120-minute ring even when
	// expire entries stopped (e.g. no leader for a long time).
	if now-f.lastExpire >= selfExpireAfter {
		f.expire(prev, now, f.idle)
	}
	f.setNow(now)
	m := MinuteOf(now)
	for _, th := range e.Tenants {
		f.track(f.register(th.Tenant), th.Hashes, th.New, m)
	}
	return nil
}

// applyDropTenant removes every series of the tenant in every shard. The
// tenant stays registered (ids are never reused) with 0 active series; its
// reservations are left alone: they belong to entries after this one, which
// release them when they apply.
func (f *FSM) applyDropTenant(e *Entry) any {
	_, now := f.advance(e)
	f.setNow(now)
	res := DropResult{Tenant: e.Tenant}
	t := f.Tenant(e.Tenant)
	if t == nil {
		return res
	}
	for s := range f.shards {
		sh := &f.shards[s]
		sh.mu.Lock()
		if int(t.id) < len(sh.tables) && sh.tables[t.id] != nil {
			// Dropping the pointer is enough: a live snapshot holds its own
			// copy of the slice, and the table itself is not written.
			sh.tables[t.id] = nil
		}
		sh.mu.Unlock()
	}
	t.mu.Lock()
	res.Removed = t.active
	t.active = 0
	t.mu.Unlock()
	return res
}

func (f *FSM) register(name string) *Tenant {
	f.regMu.RLock()
	t := f.byName[name]
	f.regMu.RUnlock()
	if t != nil {
		return t
	}
	f.regMu.Lock()
	defer f.regMu.Unlock()
	t = &Tenant{Name: name, id: uint32(len(f.tenants))}
	f.tenants = append(f.tenants, t)
	f.byName[name] = t
	return t
}

func (f *FSM) track(t *Tenant, hashes []uint64, reservedNew int, m uint8) {
	for s := range f.byShard {
		f.byShard[s] = f.byShard[s][:0]
	}
	for _, h := range hashes {
		s := h & f.shardMask
		f.byShard[s] = append(f.byShard[s], h)
	}
	created := 0
	for s, hs := range f.byShard {
		if len(hs) == 0 {
			continue
		}
		sh := &f.shards[s]
		sh.mu.Lock()
		created += f.writableTable(sh, t.id, len(hs)).PutMany(hs, m)
		sh.mu.Unlock()
	}
	t.mu.Lock()
	t.active += int64(created)
	// Followers never reserved; clamping keeps them at 0.
	t.reserved = max(0, t.reserved-int64(reservedNew))
	t.mu.Unlock()
}

// Reserve records that this node (as leader) logged n series of tenant as new.
// The reservation is released when the entry carrying them is applied.
func (f *FSM) Reserve(tenant string, n int64) {
	t := f.register(tenant)
	t.mu.Lock()
	t.reserved += n
	t.mu.Unlock()
}

// ResetReservations drops every reservation; a new leader session calls it after
// its barrier (entries of an earlier session that never committed left them behind).
func (f *FSM) ResetReservations() {
	for _, t := range f.Tenants() {
		t.mu.Lock()
		t.reserved = 0
		t.mu.Unlock()
	}
}

// TenantUsage returns a tenant's active series and outstanding reservations.
func (f *FSM) TenantUsage(name string) (active, reserved int64) {
	if t := f.Tenant(name); t != nil {
		return t.Usage()
	}
	return 0, 0
}

// writableTable returns the tenant's table in sh, creating it, or cloning it when a
// live snapshot may still be reading the current one. sh.mu must be held for writing.
func (f *FSM) writableTable(sh *shard, id uint32, hint int) *seriesmap.Table {
	for int(id) >= len(sh.tables) {
		sh.tables = append(sh.tables, nil)
		sh.gens = append(sh.gens, 0)
	}
	t := sh.tables[id]
	switch {
	case t == nil:
		t = seriesmap.New(hint)
		sh.tables[id] = t
	case sh.gens[id] != f.snapGen && f.liveSnaps.Load() > 0:
		t = t.Clone()
		sh.tables[id] = t
	}
	sh.gens[id] = f.snapGen
	return t
}

// expire removes series idle at now. Ages are computed at prev, the FSM's time
// before this entry, because every stored minute is at most prev and younger than
// the ring there; at now (possibly hours later after a leaderless gap) the ring may
// already have wrapped. A series of age a at prev is idle at now iff
// a ≥ idle − (now − prev).
func (f *FSM) expire(prev, now int64, idle int) {
	f.lastExpire = now
	gap := min(now-prev, RingMinutes)
	expired := ExpiredTable(prev, idle-int(gap))
	f.regMu.RLock()
	tenants := f.tenants
	f.regMu.RUnlock()
	for s := range f.shards {
		sh := &f.shards[s]
		sh.mu.Lock()
		for id, t := range sh.tables {
			if t == nil {
				continue
			}
			t = f.writableTable(sh, uint32(id), 0)
			if removed := t.Cleanup(expired); removed > 0 {
				tenants[id].addActive(-int64(removed))
			}
			if t.Len() == 0 {
				sh.tables[id] = nil
			}
		}
		sh.mu.Unlock()
	}
}

// Series states returned by Lookup.
const (
	StateAbsent = 0 // not present, or idle: a new series
	StateActive = 1 // active; its minute is older than now, so a refresh must be logged
	StateFresh  = 2 // active and already refreshed this minute: nothing to log
)

// Lookup classifies each hash of one tenant against the committed state at Unix
// minute now with the given idle age (IdleAge of the timeout), writing StateAbsent/StateActive/StateFresh
// into out (len(out) ≥ len(hashes)). Safe for concurrent use with Apply.
func (f *FSM) Lookup(tenant string, hashes []uint64, now int64, idle int, out []uint8) {
	out = out[:len(hashes)]
	clear(out)
	f.regMu.RLock()
	t := f.byName[tenant]
	f.regMu.RUnlock()
	if t == nil {
		return
	}
	cur := MinuteOf(now)
	// Gather the hashes shard by shard (a counting sort of their positions),
	// then look each shard's up in one GetMany under one read lock: one lock
	// round trip per shard touched, not per hash, and lookups whose cache
	// misses overlap (seriesmap.Table.GetMany says why that matters).
	sc := lookupScratchPool.Get().(*lookupScratch)
	defer lookupScratchPool.Put(sc)
	n := len(hashes)
	sc.grow(n, len(f.shards))
	offs := sc.offs
	for _, h := range hashes {
		offs[h&f.shardMask+1]++
	}
	for s := 1; s < len(offs); s++ {
		offs[s] += offs[s-1]
	}
	pos, hs := sc.pos[:n], sc.hs[:n]
	next := sc.next
	copy(next, offs[:len(f.shards)])
	for i, h := range hashes {
		s := h & f.shardMask
		k := next[s]
		next[s]++
		pos[k], hs[k] = int32(i), h
	}
	mins, found := sc.mins[:n], sc.found[:n]
	for s := range f.shards {
		lo, hi := offs[s], offs[s+1]
		if lo == hi {
			continue
		}
		sh := &f.shards[s]
		sh.mu.RLock()
		if int(t.id) < len(sh.tables) && sh.tables[t.id] != nil {
			sh.tables[t.id].GetMany(hs[lo:hi], mins[lo:hi], found[lo:hi])
		} else {
			clear(found[lo:hi])
		}
		sh.mu.RUnlock()
	}
	for k, i := range pos {
		m := mins[k]
		switch {
		case !found[k] || Age(now, m) >= idle:
		case m == cur:
			out[i] = StateFresh
		default:
			out[i] = StateActive
		}
	}
}

// lookupScratch is Lookup's working memory, reused across calls (a pool:
// Lookup runs on every leader session's decider at once).
type lookupScratch struct {
	offs, next []int32 // per shard: first gathered position (offs has one more); next free one
	pos        []int32 // gathered position → index in the caller's hashes
	hs         []uint64
	mins       []uint8
	found      []bool
}

var lookupScratchPool = sync.Pool{New: func() any { return new(lookupScratch) }}

// grow sizes the scratch for n hashes over shards shards and zeroes offs.
func (sc *lookupScratch) grow(n, shards int) {
	if cap(sc.offs) < shards+1 {
		sc.offs, sc.next = make([]int32, shards+1), make([]int32, shards)
	}
	sc.offs, sc.next = sc.offs[:shards+1], sc.next[:shards]
	clear(sc.offs)
	if cap(sc.pos) < n {
		sc.pos, sc.hs, sc.mins, sc.found = make([]int32, n), make([]uint64, n), make([]uint8, n), make([]bool, n)
	}
}

// Tenant returns the tenant's registration, or nil if it never had series here.
func (f *FSM) Tenant(name string) *Tenant {
	f.regMu.RLock()
	defer f.regMu.RUnlock()
	return f.byName[name]
}

// TenantActive returns the tenant's active series in this group.
func (f *FSM) TenantActive(name string) int64 {
	if t := f.Tenant(name); t != nil {
		return t.Active()
	}
	return 0
}

// Tenants returns a snapshot of the tenant registrations.
func (f *FSM) Tenants() []*Tenant {
	f.regMu.RLock()
	defer f.regMu.RUnlock()
	return append([]*Tenant(nil), f.tenants...)
}

// Stats is a cheap summary for metrics and status.
type Stats struct {
	Series       int64
	Tenants      int
	AppliedIndex uint64
	Now          int64
}

// Stats sums the tenants' active counters.
func (f *FSM) Stats() Stats {
	st := Stats{AppliedIndex: f.AppliedIndex(), Now: f.Now()}
	for _, t := range f.Tenants() {
		if a := t.Active(); a > 0 {
			st.Series += a
			st.Tenants++
		}
	}
	return st
}

// Restore implements raft.FSM: it replaces the whole state with a snapshot.
// A restored snapshot is a state the leader reached, so it also ends a halt:
// what follows it is applied normally (and halts again if it cannot be).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.restore(rc); err != nil {
		return err
	}
	f.halt.Store(nil)
	return nil
}
