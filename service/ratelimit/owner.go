package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Limits gives a tenant's ingestion rate (tokens/s, 0 = no limit) and burst
// (tokens, 0 = one second's worth). The server passes today's --limits-file
// values and, later, the replicated runtime config. The tick's shards call it
// from several goroutines at once.
type Limits func(tenant string) (ratePerSec float64, burst int64)

// Errors of Absorb; the service maps them to gRPC codes.
var (
	ErrInvalid     = errors.New("invalid rate report")
	ErrTooMany     = errors.New("too many tenants on one stream")
	errFirstNoID   = fmt.Errorf("%w: the first message of a stream must carry client_id", ErrInvalid)
	errBadStrategy = fmt.Errorf("%w: unknown strategy", ErrInvalid)
)

// Config tunes the owner core. Zero values take the defaults.
type Config struct {
	Period time.Duration // tick period, the same as the clients' report period; default 100ms
	// ActiveAfter: a client heard from within it counts as active (Local
	// strategy); default 3s.
	ActiveAfter time.Duration
	// ForgetAfter: a (client, tenant) not reported for this long is dropped;
	// default 30s.
	ForgetAfter time.Duration
	// MaxTenantsPerStream bounds the ids one stream may introduce; default 100,000.
	MaxTenantsPerStream int
	// Headroom: in a round with spare tokens every client first gets its
	// demand × (1 + Headroom) (Lease strategy); default 0.25.
	Headroom float64
	// DemandHalfLife smooths each client's demand (Lease); default 2 periods.
	DemandHalfLife time.Duration
	// TakeoverGuard: for this long after a node becomes a tenant's owner,
	// each Lease client is granted at most the rate it admitted at before
	// (its window counts in its first report, plus Headroom), because
	// clients that have not reached the new owner yet keep admitting at
	// their old lease rates; default 3s (clients reach a new owner over a
	// second or two: a cluster view, a redirect, a retry).
	TakeoverGuard time.Duration
	// Shards: the tenants are split into this many shards by a hash of the
	// tenant name; each shard has its own lock and, once the owner holds
	// 50,000 tenants plus (stream, tenant) entries, is ticked on its own
	// goroutine (at most GOMAXPROCS run at once), so the tick's time is
	// divided among the cores; a stream introducing a tenant waits only
	// for the tick of that tenant's shard. 0: GOMAXPROCS, at most
	// DefaultMaxShards; 1 ticks everything on the caller's goroutine.
	Shards int
	// Sliding, when set, names the tenants whose limit is a sliding window
	// of burst tokens per burst ÷ rate seconds rather than a token bucket
	// (sliding.go): Envoy rules, whose unit can be an hour. Called from the
	// tick's shards and Admit, possibly at once.
	Sliding func(tenant string) bool
}

// DefaultMaxShards caps the default shard count: past a few shards per core
// the tick gains nothing and every shard adds a pass over the streams.
const DefaultMaxShards = 16

// parallelTick is the tick's work (tenants plus entries) from which its
// shards run on goroutines of their own. Below it the whole tick is about a
// millisecond of one core (10,000 tenants × 2 clients: 1.2 ms), and on a
// busy machine the hand-off to a second goroutine waits for a core longer
// than the work it takes over: the two-shard tick took 1.7× one shard's
// wall time there, and at 100,000 tenants 0.8× (BENCHMARKS.md).
const parallelTick = 50_000

// maxShards bounds Config.Shards: each shard costs every stream a slice
// header and every tick a lock of every stream.
const maxShards = 1024

// Validate reports a configuration New cannot use, naming the field.
func (c Config) Validate() error {
	if c.Shards < 0 || c.Shards > maxShards {
		return fmt.Errorf("rateowner: Config.Shards = %d: want 0 (one per core, at most %d) or 1 to %d", c.Shards, DefaultMaxShards, maxShards)
	}
	return nil
}

func (c *Config) fill() {
	if c.Period <= 0 {
		c.Period = 100 * time.Millisecond
	}
	if c.ActiveAfter <= 0 {
		c.ActiveAfter = 3 * time.Second
	}
	if c.ForgetAfter <= 0 {
		c.ForgetAfter = 30 * time.Second
	}
	if c.MaxTenantsPerStream <= 0 {
		c.MaxTenantsPerStream = 100_000
	}
	if c.Headroom <= 0 {
		c.Headroom = 0.25
	}
	if c.DemandHalfLife <= 0 {
		c.DemandHalfLife = 2 * c.Period
	}
	if c.TakeoverGuard <= 0 {
		c.TakeoverGuard = 3 * time.Second
	}
	if c.Shards == 0 {
		c.Shards = min(runtime.GOMAXPROCS(0), DefaultMaxShards)
	}
}

// Owner is the rate state of the tenants a node owns, in memory: per tenant a
// sliding window of two fixed buckets (Blocklist) and a token bucket
// (Lease), per (client, tenant) the last cumulative counts and demand. It does
// no I/O: sessions Absorb reports, and Tick (once per period) folds them in
// and builds the updates.
//
// The tenants are split into shards (Config.Shards, by a hash of the name),
// each with its own lock, and Tick works the shards in parallel: a tenant's
// window, bucket and sums are touched only by its shard, so shards need no
// lock of each other's. Lock order, outermost first: shards (ascending
// index), o.mu, a session's lock, a second session's lock (o.mu held).
type Owner struct {
	cfg    Config
	limits Limits
	p, g   int

	shards []shard

	mu sync.Mutex // sessions, clients, lastTick
	// sessions, in the order they opened (a closed one's place is taken by
	// the last): Tick visits them in this order, so every shard folds a
	// tenant's entries in the same order whatever the shard count (float
	// sums are order-dependent) and a run is reproducible.
	sessions []*Session
	// clients: per client id, its live sessions and the tick state of its
	// closed ones, so a client that reconnects to this node continues its
	// cumulative counts instead of being counted again (see carryOver).
	clients  map[uint64]*clientRec
	lastTick int64

	// size: tenants plus entries, the tick's work. Below parallelMin the
	// shards are ticked one after the other on the caller's goroutine.
	size        atomic.Int64
	parallelMin int64

	// tickMu makes Tick calls one at a time; what follows is Tick's.
	tickMu sync.Mutex
	snap   []*Session // o.sessions as the tick began
	ownsG  []bool
}

// shard is the tenants whose name hashes to it, and the lock the tick holds
// while it works them.
type shard struct {
	mu      sync.Mutex // tenants and their tick-owned state
	tenants map[string]*tenantState
	// list holds the same tenants in the order they were created (a
	// forgotten one's place taken by the last), for the tick's walks: in
	// memory order, mostly, where the map's order is random.
	list []*tenantState
	// Keeps two shards' locks off one cache line: the shards' goroutines
	// take them at the same time.
	_ [64]byte
}

// New returns an owner for a cluster of p partitions in g groups, or an
// error naming a Config field out of range.
func New(cfg Config, p, g int, limits Limits) (*Owner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	o := &Owner{cfg: cfg, limits: limits, p: p, g: g, clients: map[uint64]*clientRec{},
		shards: make([]shard, cfg.Shards), ownsG: make([]bool, g), parallelMin: parallelTick}
	for i := range o.shards {
		o.shards[i].tenants = map[string]*tenantState{}
	}
	return o, nil
}

// shardOf is the shard of a tenant: FNV-1a of the name, as for its rate
// group, but mixed (the splitmix64 finalizer) before it is reduced, because
// the group comes from the hash's top bits: unmixed, the shards would line up
// with groups, and a node leading one group would tick all its owned tenants
// in a few shards.
func (o *Owner) shardOf(name string) int {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	hi, _ := bits.Mul64(h, uint64(len(o.shards)))
	return int(hi)
}

// Config returns the filled-in configuration.
func (o *Owner) Config() Config { return o.cfg }

type tenantState struct {
	name  string
	group int
	shard int
	pos   int // in its shard's list
	// refs: entries and carried states pointing here. It goes from 0 to 1
	// only under the shard's lock (tenant), where the tick also forgets a
	// tenant at 0, so the other changes need no lock.
	refs atomic.Int32

	// tick-owned: written by the tick of the tenant's shard (its lock
	// held), read by the updates' builders after every shard is done
	owned     bool
	epoch     uint32 // bumped when this node (re)gains ownership: entries re-seed
	rate      float64
	burst     float64
	window    int64 // ns
	curStart  int64
	cur, prev float64
	level     float64 // token bucket (Lease)
	levelAt   int64
	// guardUntil: unix ns until which grants are held to each client's
	// previous rate (TakeoverGuard); guarding is its value this tick.
	guardUntil int64
	guarding   bool
	takeover   bool  // a client with earlier counts reported within the guard
	tickAt     int64 // unix ns of this tick
	blockedTil int64
	// per-tick aggregates over entries
	sumDemand float64
	nClients  int
	// sumLastRate: Σ clients' offered rate over their last report period
	// (unsmoothed, so a jump in demand shows at once); exposure: Σ what
	// clients' caps still allow beyond their reported consumption.
	sumLastRate, exposure float64
	// idleArmed: the bucket filled since the last cap; capSince: when the
	// one-second cap after idle started (0: not running).
	idleArmed bool
	capSince  int64
	// recent: tokens folded in at each tick of about the last second,
	// oldest first (the one-second cap after idle, see Tick).
	recent  []tickCount
	avail   float64
	spare   float64
	scarce  bool
	lastUse int64
	sw      slidingState // Config.Sliding tenants
	// askedBy: per client id, the tokens this node admitted on request
	// (Admit) since it became the owner. A client's window buckets count
	// them too, so its first report here seeds (or charges) only the rest:
	// what earlier owners admitted for it. A takeover clears it.
	askedBy map[uint64]float64
}

// Session is one client's stream. Absorb is called by the stream's receive
// goroutine, Tick by the owner's; the session lock is taken once per report,
// and per tick once by each shard (its folds), once to count active clients
// and once to build the update.
type Session struct {
	o        *Owner
	mu       sync.Mutex
	started  bool
	clientID uint64
	strategy api.RateStrategy
	// entries: per shard, the entries of the tenants in it, as values,
	// ascending by client-chosen tenant id (the order Tick folded them in
	// before it was sharded): a shard's tick walks its own in memory order,
	// without a pointer chase per tenant. loc finds an id's entry.
	entries [][]entry
	loc     []entryLoc
	heardAt int64
	pending *api.RateUpdate // built by Tick, taken by the sender
	spare   *api.RateUpdate // sent and given back (Recycle): Tick refills it
	// resendLimits: an update carrying limits was replaced before it was
	// taken, so the next one must carry them again.
	resendLimits bool
	notify       chan struct{} // 1-buffered: an update is pending
	closed       bool
	idx          int // place in o.sessions (o.mu)
}

// entryLoc is where an id's entry is: s.entries[shard][i-1]; i == 0: the id
// is unused.
type entryLoc struct{ shard, i int32 }

// entry is one (session, tenant).
type entry struct {
	t  *tenantState
	id uint32
	// raw, from the last report (session lock)
	consumed, offered  uint64
	bucketStart        int64
	bucketCur, bucketP uint64
	// bucketAge (when hasAge) is how far the client's current bucket had run
	// when it counted bucketCur, by the client's clock; absorbedAt is this
	// owner's clock when the report arrived. Together they place the counts
	// on this owner's clock without comparing the two wall clocks.
	bucketAge, absorbedAt int64
	hasAge                bool
	reported              bool
	reportedAt            int64 // unix ns of the last report
	moved                 bool  // reported while not owned here: list in moved_ids once
	// superseded: the same client reported this tenant on a newer stream,
	// which took over the tick state; this entry no longer counts.
	superseded bool
	tickState
	// what this stream's client last got for the tenant's limit; updates
	// carry limit/burst/window only when they change.
	sentLimit  bool
	sentRate   float64
	sentBurst  uint64
	sentWindow int64
}

// tickState is what the owner keeps per (client, tenant) across reports
// (tick-owned); it moves to a client's new stream (carryOver).
type tickState struct {
	epoch        uint32
	seen         bool
	lastConsumed uint64
	lastOffered  uint64
	demand       float64 // tokens/s, smoothed offered
	lastRate     float64 // tokens/s offered over the last fold
	cap          uint64
	leaseRate    float64
	// guardRate: tokens/s this client admitted in the window before its
	// first report to this owner (TakeoverGuard); < 0: not held.
	guardRate float64
	// guardFrom, guardBase: when this client first reported to this
	// owner and its consumption then; during the guard its cap stays
	// within guardBase + guardRate × (time since guardFrom + a period).
	guardFrom int64
	guardBase uint64
	// sliding tenants: the cap sent at the tick before the last (e.cap),
	// what the client holds, what its demand asks for, and its part of
	// what the owner counts as held.
	capHist                        [1]uint64
	swReserve, swTarget, swCounted float64
}

// tickCount is what one tick folded in for a tenant.
type tickCount struct {
	at     int64
	tokens float64
}

// clientRec is a client's live sessions and what its closed sessions knew.
type clientRec struct {
	live  []*Session
	carry map[*tenantState]carried
}

type carried struct {
	tickState
	at int64 // unix ns the session closed
}

// NewSession registers a stream.
func (o *Owner) NewSession() *Session {
	s := &Session{o: o, notify: make(chan struct{}, 1)}
	o.mu.Lock()
	s.idx = len(o.sessions)
	o.sessions = append(o.sessions, s)
	o.mu.Unlock()
	return s
}

// Close unregisters a stream; its clients' counts stay in the tenants'
// windows, and its per-tenant state waits (ForgetAfter) for the client to
// come back on a new stream.
func (s *Session) Close() {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if s.closed {
		return
	}
	last := o.sessions[len(o.sessions)-1]
	o.sessions[s.idx], last.idx = last, s.idx
	o.sessions[len(o.sessions)-1] = nil
	o.sessions = o.sessions[:len(o.sessions)-1]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var rec *clientRec
	if s.started {
		rec = o.clients[s.clientID]
	}
	if rec != nil {
		rec.live = slices.DeleteFunc(rec.live, func(x *Session) bool { return x == s })
	}
	now := o.lastTick
	for k := range s.entries {
		for i := range s.entries[k] {
			e := &s.entries[k][i]
			if rec != nil && e.seen && !e.superseded {
				if rec.carry == nil {
					rec.carry = map[*tenantState]carried{}
				}
				rec.carry[e.t] = carried{tickState: e.tickState, at: now}
				e.t.refs.Add(1) // held by the carry until it is forgotten
			}
			o.release(e.t)
		}
		o.size.Add(-int64(len(s.entries[k])))
	}
	s.entries, s.loc = nil, nil
	if rec != nil && len(rec.live) == 0 && len(rec.carry) == 0 {
		delete(o.clients, s.clientID)
	}
}

// Recycle gives back an update taken and sent, so the next tick fills it
// instead of allocating (the sender must not touch it afterwards).
func (s *Session) Recycle(u *api.RateUpdate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare == nil && u != s.pending {
		s.spare = u
	}
}

func (o *Owner) release(t *tenantState) {
	t.refs.Add(-1)
}

// Notify is signalled when Take has an update.
func (s *Session) Notify() <-chan struct{} { return s.notify }

// Take returns the pending update, nil if none.
func (s *Session) Take() *api.RateUpdate {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.pending
	s.pending = nil
	return u
}

// ClientID is the id from the stream's first report (0 before it).
func (s *Session) ClientID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientID
}

// Absorb records one report. It only stores the cumulative counts; Tick folds
// them in. An error leaves nothing of the report applied.
func (s *Session) Absorb(r *api.RateReport, now time.Time) error {
	n := len(r.Ids)
	// Bucket counts come only when a tenant joined the stream (all three
	// arrays, or none): the owner needs them only to seed.
	withBuckets := len(r.BucketStartUnixNanos) > 0 || len(r.BucketConsumed) > 0 || len(r.PrevBucketConsumed) > 0 || len(r.BucketAgeNanos) > 0
	// bucket_age_nanos is newer than the other bucket arrays: a client that
	// predates it sends none.
	withAges := len(r.BucketAgeNanos) > 0
	if len(r.ConsumedTotal) != n || len(r.OfferedTotal) != n || (withBuckets && (len(r.BucketStartUnixNanos) != n ||
		len(r.BucketConsumed) != n || len(r.PrevBucketConsumed) != n || (withAges && len(r.BucketAgeNanos) != n))) {
		return fmt.Errorf("%w: parallel arrays differ in length (%d ids, %d consumed, %d offered, %d bucket starts, %d bucket counts, %d previous bucket counts, %d bucket ages)",
			ErrInvalid, n, len(r.ConsumedTotal), len(r.OfferedTotal), len(r.BucketStartUnixNanos), len(r.BucketConsumed), len(r.PrevBucketConsumed), len(r.BucketAgeNanos))
	}
	for i, a := range r.BucketAgeNanos {
		if a < 0 {
			return fmt.Errorf("%w: bucket_age_nanos[%d] = %d is negative", ErrInvalid, i, a)
		}
	}
	if len(r.NewIds) != len(r.NewNames) {
		return fmt.Errorf("%w: %d new ids but %d new names", ErrInvalid, len(r.NewIds), len(r.NewNames))
	}
	var newIDs map[uint32]bool
	if len(r.NewIds) > 8 {
		newIDs = make(map[uint32]bool, len(r.NewIds))
	}
	for i, id := range r.NewIds {
		if newIDs != nil {
			newIDs[id] = true
		}
		if id == 0 {
			return fmt.Errorf("%w: tenant id 0 is reserved", ErrInvalid)
		}
		if int(id) > s.o.cfg.MaxTenantsPerStream {
			return fmt.Errorf("%w: tenant id %d, at most %d tenants per stream", ErrTooMany, id, s.o.cfg.MaxTenantsPerStream)
		}
		if err := api.ValidateTenantID(r.NewNames[i]); err != nil {
			return fmt.Errorf("%w: new_names[%d]: %w", ErrInvalid, i, err)
		}
	}
	// New names need their shards' tenant tables, whose locks a shard's
	// tick takes before any session lock, and o.mu (clients, carried
	// state): same order here. Only the new names' shards are locked, so a
	// new tenant waits for the tick of its own shard only. Reports without
	// new names (nearly all) take only the session lock.
	o := s.o
	if len(r.NewIds) > 0 {
		defer o.lockShards(r.NewNames)()
		o.mu.Lock()
		defer o.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	started, clientID, strategy := s.started, s.clientID, s.strategy
	if !started {
		if r.ClientId == 0 {
			return errFirstNoID
		}
		switch r.Strategy {
		case api.RateStrategy_RATE_STRATEGY_LEASE, api.RateStrategy_RATE_STRATEGY_BLOCKLIST, api.RateStrategy_RATE_STRATEGY_LOCAL:
		default:
			return fmt.Errorf("%w %d", errBadStrategy, r.Strategy)
		}
		clientID, strategy = r.ClientId, r.Strategy
	}
	for i, id := range r.NewIds {
		if s.known(id) && s.entry(id).t.name != r.NewNames[i] {
			return fmt.Errorf("%w: tenant id %d renamed from %q to %q", ErrInvalid, id, s.entry(id).t.name, r.NewNames[i])
		}
	}
	for i, id := range r.Ids {
		if !s.known(id) && !newIDs[id] && (newIDs != nil || !slices.Contains(r.NewIds, id)) {
			return fmt.Errorf("%w: ids[%d] = %d was never introduced (send it in new_ids/new_names first)", ErrInvalid, i, id)
		}
	}
	// Valid: apply.
	s.started, s.clientID, s.strategy = true, clientID, strategy
	if len(r.NewIds) > 0 {
		top := int(slices.Max(r.NewIds))
		if top >= len(s.loc) {
			s.loc = slices.Grow(s.loc, top+1-len(s.loc))[:top+1]
		}
	}
	for i, id := range r.NewIds {
		if s.known(id) {
			continue
		}
		e := s.add(id, o.tenant(r.NewNames[i]))
		o.carryOver(s, e)
	}
	ns := now.UnixNano()
	s.heardAt = ns
	cons, offd, bs, bc, bp := r.ConsumedTotal, r.OfferedTotal, r.BucketStartUnixNanos, r.BucketConsumed, r.PrevBucketConsumed
	for i, id := range r.Ids {
		e := s.entry(id)
		e.consumed, e.offered = cons[i], offd[i]
		if withBuckets {
			e.bucketStart, e.bucketCur, e.bucketP = bs[i], bc[i], bp[i]
			e.hasAge, e.absorbedAt = withAges, ns
			if withAges {
				e.bucketAge = r.BucketAgeNanos[i]
			}
		}
		e.reported = true
		e.reportedAt = ns
	}
	return nil
}

func (s *Session) known(id uint32) bool { return int(id) < len(s.loc) && s.loc[id].i != 0 }

// entry is id's entry; the id is known.
func (s *Session) entry(id uint32) *entry {
	l := s.loc[id]
	return &s.entries[l.shard][l.i-1]
}

// add makes the entry of a new id for tenant t, in t's shard's list (kept
// ascending by id: ids nearly always arrive in order, and then it is an
// append). The pointer is good until the next add.
func (s *Session) add(id uint32, t *tenantState) *entry {
	if s.entries == nil {
		s.entries = make([][]entry, len(s.o.shards))
	}
	k := t.shard
	l := s.entries[k]
	i := len(l)
	if i > 0 && l[i-1].id > id {
		i, _ = slices.BinarySearchFunc(l, id, func(e entry, id uint32) int { return cmp.Compare(e.id, id) })
	}
	l = slices.Insert(l, i, entry{t: t, id: id})
	s.o.size.Add(1)
	s.entries[k] = l
	for j := i; j < len(l); j++ { // the new entry, and those it moved
		s.loc[l[j].id] = entryLoc{shard: int32(k), i: int32(j + 1)}
	}
	return &l[i]
}

// lockShards locks the shards of the given tenant names, in ascending order
// (the lock order), and returns the function that unlocks them.
func (o *Owner) lockShards(names []string) (unlock func()) {
	ks := make([]int, 0, min(len(names), len(o.shards)))
	for _, n := range names {
		ks = append(ks, o.shardOf(n))
	}
	slices.Sort(ks)
	ks = slices.Compact(ks)
	for _, k := range ks {
		o.shards[k].mu.Lock()
	}
	return func() {
		for _, k := range ks {
			o.shards[k].mu.Unlock()
		}
	}
}

// carryOver gives a tenant newly introduced on s the tick state its client
// had for it on an earlier stream to this node (still open, or closed less
// than ForgetAfter ago). Counts are cumulative per client process, so the new
// stream continues from the last folded count: a reconnecting client is not
// counted twice (its bucket counts re-seed only a client this node never
// heard about the tenant). o.mu and s.mu held.
func (o *Owner) carryOver(s *Session, e *entry) {
	rec := o.clients[s.clientID]
	if rec == nil {
		rec = &clientRec{}
		o.clients[s.clientID] = rec
	}
	if !slices.Contains(rec.live, s) {
		rec.live = append(rec.live, s)
	}
	for _, old := range rec.live {
		if old == s || old.strategy != s.strategy {
			continue
		}
		// o.mu serialises every path that holds two session locks.
		old.mu.Lock()
		var olds []entry
		if old.entries != nil {
			olds = old.entries[e.t.shard]
		}
		for i := range olds {
			oe := &olds[i]
			if oe.t == e.t && !oe.superseded {
				if oe.seen {
					e.tickState = oe.tickState
				}
				oe.superseded = true
			}
		}
		old.mu.Unlock()
	}
	if c, ok := rec.carry[e.t]; ok {
		if !e.seen {
			e.tickState = c.tickState
		}
		delete(rec.carry, e.t)
		o.release(e.t)
	}
}

// tenant returns (creating) a tenant's state; its shard's lock held.
func (o *Owner) tenant(name string) *tenantState {
	k := o.shardOf(name)
	sh := &o.shards[k]
	t := sh.tenants[name]
	if t == nil {
		t = &tenantState{name: name, group: api.RateGroup(name, o.p, o.g), shard: k, pos: len(sh.list)}
		sh.tenants[name] = t
		sh.list = append(sh.list, t)
		o.size.Add(1)
	}
	t.refs.Add(1)
	return t
}

// lookup returns a tenant's state, nil if none (tests).
func (o *Owner) lookup(name string) *tenantState {
	sh := &o.shards[o.shardOf(name)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.tenants[name]
}

// Tick folds the reports absorbed since the last tick into the tenants' state,
// decides blocklists and leases, and leaves one update per session (Take).
// owns says whether this node leads a group; leaderOf names a group's leader
// for redirects, and may be called from several goroutines at once (as the
// Limits are). Calls are serialised; one goroutine is meant to make them.
//
// The shards are ticked in parallel (fold the reports, decide), then the
// sessions' updates are built in parallel, once the owner holds parallelTick
// tenants plus entries (below, one after the other on the caller's
// goroutine). A tenant's result depends neither on the shard count nor on
// that: each shard folds its tenants' entries in the order of the sessions,
// and an update reads only tenants' decided state.
func (o *Owner) Tick(now time.Time, owns func(group int) bool, leaderOf func(group int) (id, addr string)) {
	o.tickMu.Lock()
	defer o.tickMu.Unlock()
	ns := now.UnixNano()
	dt := float64(o.cfg.Period) / 1e9
	// o.mu for lastTick (Session.Close reads it to stamp carried state) and
	// the sessions, held only for the copy: the shards lock what they work.
	o.mu.Lock()
	if o.lastTick != 0 && ns > o.lastTick {
		dt = float64(ns-o.lastTick) / 1e9
	}
	o.lastTick = ns
	o.snap = append(o.snap[:0], o.sessions...)
	o.mu.Unlock()
	alpha := 1 - math.Exp2(-dt*1e9/float64(o.cfg.DemandHalfLife))
	for g := range o.ownsG {
		o.ownsG[g] = owns(g)
	}
	workers := len(o.shards)
	if o.size.Load() < o.parallelMin {
		workers = 1
	}
	parallel(len(o.shards), workers, func(k int) { o.tickShard(k, ns, dt, alpha) })

	// Active clients per strategy: a deployment runs one strategy, and a
	// benchmark running several side by side must not mix their counts.
	active := map[api.RateStrategy]map[uint64]struct{}{}
	for _, s := range o.snap {
		s.mu.Lock()
		if s.started && !s.closed && ns-s.heardAt <= int64(o.cfg.ActiveAfter) {
			if active[s.strategy] == nil {
				active[s.strategy] = map[uint64]struct{}{}
			}
			active[s.strategy][s.clientID] = struct{}{}
		}
		s.mu.Unlock()
	}
	// Closed streams' state waits ForgetAfter for its client to come back.
	o.mu.Lock()
	for id, rec := range o.clients {
		for t, c := range rec.carry {
			if ns-c.at > int64(o.cfg.ForgetAfter) {
				delete(rec.carry, t)
				o.release(t)
			}
		}
		if len(rec.live) == 0 && len(rec.carry) == 0 {
			delete(o.clients, id)
		}
	}
	o.mu.Unlock()

	// 4. sessions: updates, on as many goroutines as shards. Every shard is
	// decided; an update only reads tenants' state (and writes its own
	// session's entries).
	parallel(len(o.snap), workers, func(i int) {
		s := o.snap[i]
		s.mu.Lock()
		if !s.started || s.closed {
			s.mu.Unlock()
			return
		}
		o.buildUpdate(s, uint32(len(active[s.strategy])), ns, dt, leaderOf)
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	})
	clear(o.snap) // no closed session kept alive until the next tick
}

// tickShard runs shard k's part of a tick: its tenants' ownership, limits
// and buckets, the folds of their entries, and the decisions.
func (o *Owner) tickShard(k int, ns int64, dt, alpha float64) {
	sh := &o.shards[k]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// 1. tenants: ownership, limits, window rotation, bucket refill.
	// Backwards, so the one that takes a forgotten tenant's place has been
	// seen.
	for i := len(sh.list) - 1; i >= 0; i-- {
		t := sh.list[i]
		name := t.name
		// A sliding-window tenant is kept while its log holds admissions:
		// forgotten, its next request would start an empty window.
		if t.refs.Load() <= 0 && ns-t.lastUse > int64(o.cfg.ForgetAfter) && (len(t.sw.log) == 0 || ns-t.sw.log[len(t.sw.log)-1].at >= t.sw.win) {
			sh.forget(t)
			o.size.Add(-1)
			continue
		}
		owned := o.ownsG[t.group]
		if owned && !t.owned {
			o.reset(t, ns)
		}
		t.owned = owned
		if !owned {
			continue
		}
		rate, burst := o.limits(name)
		if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
			rate = 0
		}
		t.rate = rate
		t.burst = float64(burst)
		if t.burst <= 0 {
			t.burst = rate // one second's worth
		}
		w := int64(time.Second)
		if rate > 0 {
			w = int64(t.burst / rate * 1e9)
			w = min(max(w, int64(o.cfg.Period)), int64(time.Minute))
		}
		if limit, win, ok := slidingLimits(rate, burst); ok && o.cfg.Sliding != nil && o.cfg.Sliding(name) {
			if t.sw.win != win {
				t.sw.log, t.sw.sum = t.sw.log[:0], 0
			}
			t.sw.on, t.sw.limit, t.sw.win = true, limit, win
			t.sw.trim(ns)
			t.sw.reserve, t.sw.want = 0, 0
			w = win // the clients' buckets span the unit: a takeover seeds from them
		} else {
			t.sw.on = false
		}
		if w != t.window {
			t.window, t.cur, t.prev = w, 0, 0
			t.curStart = ns - ns%w
		}
		t.rotate(ns)
		if math.IsInf(t.level, 1) {
			t.level = t.burst // a new owner's bucket starts full; reports charge it
		}
		if t.levelAt != 0 && ns > t.levelAt {
			// A saturated tenant's bucket holds its burst plus two periods'
			// refill (the period granted ahead, and one for reports that
			// arrive a tick late): the grants that clients could not spend
			// (a lease rarely ends on a whole request; a client drew fewer
			// requests than its share) are carried into the next grants
			// instead of being cut off at the burst, which with a burst of
			// one period's refill lost a fifth of the limit. An idle
			// tenant's bucket still stops at the burst.
			top := t.burst
			if t.scarce {
				top += 2 * t.rate * dt
			}
			t.level = min(top, t.level+t.rate*float64(ns-t.levelAt)/1e9)
		}
		t.levelAt = ns
		t.sumDemand, t.nClients, t.sumLastRate, t.exposure = 0, 0, 0, 0
	}
	// 2. entries: deltas into windows and buckets, demand. Every shard
	// visits the sessions in the same order, so a tenant's sums add up in
	// the same order whatever the shard count.
	for _, s := range o.snap {
		s.mu.Lock()
		if s.entries != nil {
			es := s.entries[k]
			for i := range es {
				if e := &es[i]; !e.superseded {
					o.fold(e, s.clientID, ns, dt, alpha)
				}
			}
		}
		s.mu.Unlock()
	}
	// 3. tenants: blocklist and lease budget.
	for _, t := range sh.list {
		if !t.owned || t.rate <= 0 {
			continue
		}
		if t.sw.on {
			t.blockedTil = 0
			if t.sw.sum >= t.sw.limit {
				t.blockedTil = ns + int64(t.sw.nextFree(ns))
			}
			t.slidingDecide()
			continue
		}
		t.blockedTil = 0
		if bf := blockedFor(t.rate, float64(t.window)/1e9, float64(ns-t.curStart)/1e9, t.prev, t.cur); bf > 0 {
			t.blockedTil = ns + int64(bf*1e9)
		}
		// Debt: a negative level (admissions past the grants: fail open,
		// lease extensions while the owner was away, a takeover's charge)
		// is paid back from the refill before anything is granted, down to
		// one second's worth or the burst (debtFloor), so an outage's
		// over-admission is repaid within about a second, not forgiven.
		t.level = max(t.level, -t.debtFloor())
		t.avail = max(0, t.level+t.rate*dt)
		t.guarding, t.tickAt = ns < t.guardUntil && t.takeover, ns
		if t.guarding {
			// What the guard does not grant, the clients not seen yet may
			// be admitting: nothing accumulates in the bucket meanwhile, or
			// it would be granted as a burst when the guard ends.
			top := t.rate * dt
			if ns+int64(dt*1e9) >= t.guardUntil {
				top = 0 // the last guarded tick: the carry would be a burst
			}
			t.level = min(t.level, top)
			t.avail = max(0, t.level+t.rate*dt)
		}
		// After idle the bucket is full: a token bucket alone admits the
		// burst and then the refill, up to 2× the limit in one second with
		// the default burst. So a tenant whose bucket filled up (it used
		// less than its limit) is armed, and when its clients are then
		// offered at least twice the limit (their leases will be spent at
		// once), for the next second the grants keep any second within
		// spanCap: what the last second minus one period admitted, plus
		// every cap's unreported remainder (taken as spent), plus this
		// tick's grants. What that withholds is forfeited, as in a sliding
		// window: left in the bucket it would be granted once the second
		// is over. A saturated tenant's bucket never fills, so the steady
		// state never meets this cap (it would trim the steady state's
		// random swings: the folds of a second are known only to a tick).
		if t.level >= 0.9*t.burst && t.burst > 2*t.rate*dt {
			// (A burst of two periods' refill or less adds at most that
			// to a second: nothing to cap.)
			t.idleArmed = true
		}
		if t.idleArmed && max(t.sumDemand, t.sumLastRate) >= 2*t.rate {
			if t.capSince == 0 {
				t.capSince = ns
			}
			if ns-t.capSince <= int64(time.Second) {
				w := t.recentSince(ns + int64(dt*1e9) - int64(time.Second))
				if capped := max(0, t.spanCap()-w-t.exposure); capped < t.avail {
					t.avail = capped
					t.level = min(t.level, max(0, capped-t.rate*dt))
				}
			} else {
				t.idleArmed, t.capSince = false, 0
			}
		}
		need := t.sumDemand * dt * (1 + o.cfg.Headroom)
		t.scarce = need >= t.avail
		t.spare = 0
		if !t.scarce {
			t.spare = t.avail - need
		}
	}
}

// forget drops a tenant no entry or carried state points to (sh.mu held).
func (sh *shard) forget(t *tenantState) {
	delete(sh.tenants, t.name)
	last := sh.list[len(sh.list)-1]
	sh.list[t.pos], last.pos = last, t.pos
	sh.list[len(sh.list)-1] = nil
	sh.list = sh.list[:len(sh.list)-1]
}

// parallel runs f(0) … f(n-1) on up to workers goroutines, and no more than
// GOMAXPROCS (the caller's one of them), and returns when all have returned.
func parallel(n, workers int, f func(i int)) {
	w := min(n, workers, runtime.GOMAXPROCS(0))
	if w <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			f(i)
		}
	}
	var wg sync.WaitGroup
	for range w - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// fold takes one entry's last report into its tenant's window, bucket and
// demand (the tenant's shard's lock and the session's lock held).
func (o *Owner) fold(e *entry, client uint64, ns int64, dt, alpha float64) {
	t := e.t
	if !t.owned {
		e.moved = e.moved || e.reported
		e.reported = false
		return
	}
	t.lastUse = ns
	if e.reported {
		e.reported = false
		if !e.seen || e.epoch != t.epoch {
			// First word from this client about this tenant since this
			// node owns it: its own bucket counts rebuild its share of the
			// window (failover, new client).
			e.seen, e.epoch = true, t.epoch
			if e.hasAge {
				e.seedByAge(t, ns)
			} else {
				switch e.bucketStart {
				case t.curStart:
					t.cur += float64(e.bucketCur)
					t.prev += float64(e.bucketP)
				case t.curStart - t.window:
					t.prev += float64(e.bucketCur)
				}
			}
			// The rate this client admitted at before, which it may keep
			// during a takeover guard: both buckets' counts over the time
			// from the previous bucket's start to its report. Only a
			// client that admitted in the previous bucket too has counts
			// that span a whole window; one that started within the
			// current bucket (a tenant new to the cluster: its clients
			// admitted without any lease) is not held to it.
			e.guardRate = -1
			span := e.reportedAt - (e.bucketStart - t.window)
			if e.hasAge {
				span = e.bucketAge + t.window // by the client's own clock: no wall-clock comparison
			}
			if e.bucketP > 0 && span > 0 {
				e.guardRate = float64(e.bucketCur+e.bucketP) / (float64(span) / 1e9)
			}
			// Charge the bucket with what this client admitted in the
			// sliding window: at the limit, that empties it (a new client;
			// a tenant new to the cluster, whose bucket starts full). In a
			// takeover the guard holds the bucket empty instead: the
			// clients not seen yet are taken to have used their whole
			// share, and the reporters' counts are in that already.
			asked := t.askedBy[client]
			switch {
			case t.sw.on:
				// Its admissions before this owner heard of it (a
				// takeover; what a client admitted failing open).
				t.sw.seed(e, ns, asked)
			case ns < t.guardUntil && e.guardRate >= 0:
				t.takeover = true
			default:
				t.level -= max(0, e.windowCount(t.curStart, t.window, ns)-asked)
			}
			e.guardFrom, e.guardBase = ns, e.consumed
			e.lastConsumed, e.lastOffered = e.consumed, e.offered
			e.cap = e.consumed
			e.capHist = [1]uint64{e.consumed}
		}
		d := float64(e.consumed - min(e.consumed, e.lastConsumed))
		off := float64(e.offered - min(e.offered, e.lastOffered))
		e.lastConsumed, e.lastOffered = max(e.consumed, e.lastConsumed), max(e.offered, e.lastOffered)
		t.cur += d
		t.level -= d
		t.addRecent(ns, d)
		if t.sw.on {
			t.sw.add(ns, d)
		}
		e.lastRate = off / dt
		e.demand += alpha * (e.lastRate - e.demand)
	} else {
		e.demand -= alpha * e.demand
	}
	t.sumDemand += e.demand
	t.nClients++
	t.sumLastRate += e.lastRate
	if e.cap > e.lastConsumed {
		t.exposure += float64(e.cap - e.lastConsumed)
	}
	if t.sw.on {
		o.slidingFold(t, e, dt)
	}
}

// buildUpdate leaves s's update for this tick in s.pending, reusing the
// message the sender gave back (or the one it has not taken yet). Limit,
// burst and window go out only when one of them changed for some tenant of
// the stream since the last update, so a steady update carries ids, caps and
// lease rates (or blocked-for) only. s.mu held.
func (o *Owner) buildUpdate(s *Session, activeClients uint32, ns int64, dt float64, leaderOf func(int) (string, string)) {
	u := s.pending
	if u != nil {
		s.resendLimits = s.resendLimits || len(u.Limit) > 0 // replaced before the sender took it
	} else if u = s.spare; u != nil {
		s.spare = nil
	} else {
		u = &api.RateUpdate{}
	}
	u.ActiveClients = activeClients
	u.Ids, u.Limit, u.Burst, u.WindowNanos = u.Ids[:0], u.Limit[:0], u.Burst[:0], u.WindowNanos[:0]
	u.BlockedForNanos, u.Cap, u.LeaseRate, u.MovedIds, u.Redirects = u.BlockedForNanos[:0], u.Cap[:0], u.LeaseRate[:0], u.MovedIds[:0], nil
	if cap(u.Ids) < len(s.loc) {
		n := len(s.loc)
		u.Ids = make([]uint32, 0, n)
		switch s.strategy {
		case api.RateStrategy_RATE_STRATEGY_BLOCKLIST:
			u.BlockedForNanos = make([]int64, 0, n)
		case api.RateStrategy_RATE_STRATEGY_LEASE:
			u.Cap, u.LeaseRate = make([]uint64, 0, n), make([]float64, 0, n)
		}
	}
	limitsChanged := s.resendLimits
	var movedGroups []bool
	for id, l := range s.loc {
		if l.i == 0 {
			continue
		}
		e := &s.entries[l.shard][l.i-1]
		t := e.t
		if e.superseded {
			continue
		}
		if !t.owned {
			if !e.moved {
				continue
			}
			e.moved = false
			u.MovedIds = append(u.MovedIds, uint32(id))
			if movedGroups == nil {
				movedGroups = make([]bool, o.g)
			}
			movedGroups[t.group] = true
			continue
		}
		if !e.seen || e.epoch != t.epoch {
			continue // nothing reported since this node took over
		}
		u.Ids = append(u.Ids, uint32(id))
		if !e.sentLimit || e.sentRate != t.rate || e.sentBurst != uint64(t.burst) || e.sentWindow != t.window {
			e.sentLimit, e.sentRate, e.sentBurst, e.sentWindow = true, t.rate, uint64(t.burst), t.window
			limitsChanged = true
		}
		switch s.strategy {
		case api.RateStrategy_RATE_STRATEGY_BLOCKLIST:
			var bf int64
			if t.blockedTil > ns {
				bf = t.blockedTil - ns
			}
			u.BlockedForNanos = append(u.BlockedForNanos, bf)
		case api.RateStrategy_RATE_STRATEGY_LEASE:
			switch {
			case t.sw.on:
				o.slidingGrant(t, e)
			case t.rate > 0:
				o.grant(t, e, dt)
			}
			u.Cap = append(u.Cap, e.cap)
			u.LeaseRate = append(u.LeaseRate, e.leaseRate)
		}
	}
	s.resendLimits = false
	if limitsChanged {
		for _, id := range u.Ids {
			e := s.entry(id)
			u.Limit = append(u.Limit, e.sentRate)
			u.Burst = append(u.Burst, e.sentBurst)
			u.WindowNanos = append(u.WindowNanos, e.sentWindow)
		}
	}
	for g, m := range movedGroups {
		if m {
			id, addr := leaderOf(g)
			u.Redirects = append(u.Redirects, &api.RateRedirect{Group: uint32(g), LeaderId: id, LeaderGrpcAddress: addr})
		}
	}
	s.pending = u
}

// seedByAge adds a client's two bucket counts to the tenant's window. The
// client's buckets are placed on this owner's clock from their age: its
// current one ended when the report arrived (absorbedAt) and began bucketAge
// before, its previous one is the window before that. Each count is spread
// evenly over its bucket and split between this owner's current and previous
// buckets by overlap; what falls before the previous bucket has left the
// window. Only durations and this owner's own clock are used, so a client
// whose wall clock is off by any amount seeds the same window as a correct
// one (docs/clocks.md). Assumes the client's bucket length is the window this
// owner's predecessor sent it, which is the one computed here from the same
// limits.
func (e *entry) seedByAge(t *tenantState, ns int64) {
	w := t.window
	age := min(e.bucketAge, w)
	end := min(e.absorbedAt, ns)
	curFrom, prevFrom := t.curStart, t.curStart-w
	spread := func(n float64, from, to int64) {
		if n == 0 {
			return
		}
		if to <= from { // an empty span (a bucket that just began): all of it is now
			if to >= curFrom {
				t.cur += n
			} else if to >= prevFrom {
				t.prev += n
			}
			return
		}
		span := float64(to - from)
		t.cur += n * float64(max(0, to-max(from, curFrom))) / span
		t.prev += n * float64(max(0, min(to, curFrom)-max(from, prevFrom))) / span
	}
	spread(float64(e.bucketCur), end-age, end)
	spread(float64(e.bucketP), end-age-w, end-age)
}

// windowCount is the client's admitted tokens in the sliding window ending
// now, from its two bucket counts (a linear approximation of the sliding window).
func (e *entry) windowCount(curStart, window, ns int64) float64 {
	if e.hasAge {
		// The client's buckets placed as in seedByAge, each count spread
		// evenly over its bucket: the part inside the window ending now.
		// A fresh report gives bucketCur + bucketP × (1 − age/window);
		// one absorbed more than a window ago gives 0.
		age := min(e.bucketAge, window)
		end := min(e.absorbedAt, ns)
		in := func(n float64, from, to int64) float64 {
			if to <= from {
				if to > ns-window {
					return n
				}
				return 0
			}
			return n * float64(max(0, to-max(from, ns-window))) / float64(to-from)
		}
		return in(float64(e.bucketCur), end-age, end) + in(float64(e.bucketP), end-age-window, end-age)
	}
	prevPart := 1 - float64(ns-curStart)/float64(window)
	switch e.bucketStart {
	case curStart:
		return float64(e.bucketCur) + float64(e.bucketP)*prevPart
	case curStart - window:
		return float64(e.bucketCur) * prevPart
	}
	return 0
}

// reset starts a tenant's state on a node that just became its owner. The
// window and bucket are rebuilt from the clients' first reports (each carries
// the client's own counts for the current and previous buckets), so a
// failover does not reset the window to zero: it is whole again once every
// client reported, within one report period of the clients reaching this node.
func (o *Owner) reset(t *tenantState, ns int64) {
	t.epoch++
	t.askedBy = nil
	t.cur, t.prev, t.window, t.curStart = 0, 0, 0, 0
	t.blockedTil = 0
	t.level, t.levelAt = math.Inf(1), ns // set to the burst once the limit is read
	// A takeover (some client reports counts that span a window, so it
	// was admitting under an earlier owner) is guarded for TakeoverGuard.
	t.guardUntil, t.takeover = ns+int64(o.cfg.TakeoverGuard), false
}

// spanCap is the most a tenant's grants let it admit in one second after
// idle, tokens: the larger of its burst and one second's refill, plus 5%:
// the cap counts the folds of ticks, which lag the admissions by up to a
// report period, and without the slack an on/off tenant's on phases lost
// 3–7% (simulation: max 1-s window 1.01× either way).
func (t *tenantState) spanCap() float64 { return 1.05 * max(t.burst, t.rate) }

// addRecent counts tokens folded in at ns (one entry per tick) and drops
// entries older than a second.
func (t *tenantState) addRecent(ns int64, tokens float64) {
	if n := len(t.recent); n > 0 && t.recent[n-1].at == ns {
		t.recent[n-1].tokens += tokens
	} else {
		t.recent = append(t.recent, tickCount{at: ns, tokens: tokens})
	}
	i := 0
	for i < len(t.recent) && t.recent[i].at <= ns-int64(time.Second) {
		i++
	}
	if i > 0 {
		t.recent = append(t.recent[:0], t.recent[i:]...)
	}
}

// recentSince is the tokens folded in after from.
func (t *tenantState) recentSince(from int64) float64 {
	var sum float64
	for _, c := range t.recent {
		if c.at > from {
			sum += c.tokens
		}
	}
	return sum
}

// debtFloor is the most debt a tenant carries, tokens: the larger of its
// burst and one second's refill.
func (t *tenantState) debtFloor() float64 { return max(t.burst, t.rate) }

func (t *tenantState) rotate(ns int64) {
	start := ns - ns%t.window
	switch {
	case start == t.curStart:
	case start == t.curStart+t.window:
		t.prev, t.cur = t.cur, 0
	default:
		t.prev, t.cur = 0, 0
	}
	t.curStart = start
}

// grant sets a Lease client's new cap: its reported consumption plus its part
// of the tokens available this round. When tokens are short every client gets
// a part proportional to its demand; when there are spare tokens each first
// gets its demand with headroom, and the spare is split half by demand, half
// evenly (so a client whose traffic is momentarily low still has room).
func (o *Owner) grant(t *tenantState, e *entry, dt float64) {
	var lease float64
	share := 1 / float64(max(1, t.nClients))
	if t.sumDemand > 0 {
		share = e.demand / t.sumDemand
	}
	if t.scarce {
		lease = t.avail * share
	} else {
		lease = e.demand*dt*(1+o.cfg.Headroom) + t.spare*(share/2+0.5/float64(max(1, t.nClients)))
	}
	e.cap = e.lastConsumed + uint64(lease)
	if t.guarding && e.guardRate >= 0 {
		// Just after a takeover, clients that have not reported to this
		// owner yet still admit at their old lease rates, unseen: granting
		// the reporters the whole refill (let alone the bucket) would
		// admit up to twice the limit. Each client keeps the rate it had
		// (plus Headroom), as a budget since its first report, so the
		// part of a lease too small for a whole request carries over.
		since := float64(t.tickAt-e.guardFrom)/1e9 + dt
		budget := e.guardBase + uint64(e.guardRate*since*(1+o.cfg.Headroom))
		e.cap = max(e.lastConsumed, min(e.cap, budget))
	}
	e.leaseRate = t.rate * share
}

// blockedFor is the blocklist rule for the sliding window of two fixed buckets:
// the window rate is prev × (remaining part of the previous bucket) + cur,
// over the span; above the limit, the tenant is blocked until the end of the
// current bucket if the current bucket alone exceeds the budget, else until the
// previous bucket's decay brings the rate back to the limit. Times in seconds.
func blockedFor(limit, span, curAge, prev, cur float64) float64 {
	prevAge := span - curAge
	rate := (prev*(prevAge/span) + cur) / span
	if rate <= limit {
		return 0
	}
	if cur >= limit*span {
		return span - curAge
	}
	decay := prev / span
	if decay <= 0 {
		return prevAge
	}
	return min(prevAge, (rate-limit)/decay)
}
