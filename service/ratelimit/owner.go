package ratelimit

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
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
// lock of each other's. The lock order is the package's (doc.go).
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

	// table routes tenants to groups once partitions have moved (nil: the
	// arithmetic of p and g). SetLayout replaces it.
	table atomic.Pointer[layout.Table]
	// moves: per partition, the group it last moved from and when
	// (SetLayout; handoff.go).
	moves atomic.Pointer[partMoves]
	// handoffs counts keys handed over to this node (Import) and waits
	// that ended without a hand-off (expireHandoff).
	handoffs, handoffsMissed atomic.Uint64
	handPending              atomic.Int64 // tenants waiting for a hand-off
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
	takeover   bool // a client with earlier counts reported within the guard
	// guardShares: Σ lease_share of the clients that reported within the
	// guard; at 1 every lease is accounted for and the guard ends.
	guardShares float64
	tickAt      int64 // unix ns of this tick
	blockedTil  int64
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
	// hand: a planned move's hand-off to this node (handoff.go);
	// released: this node handed the tenant over, and decides it no more
	// until it owns it again.
	hand     handState
	released bool
}

// tenant returns (creating) a tenant's state; its shard's lock held.
func (o *Owner) tenant(name string) *tenantState {
	k := o.shardOf(name)
	sh := &o.shards[k]
	t := sh.tenants[name]
	if t == nil {
		t = &tenantState{name: name, group: o.groupOf(name), shard: k, pos: len(sh.list)}
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

// groupOf is the raft group owning a tenant's rate state: by the layout
// table once SetLayout gave one, else by the arithmetic.
func (o *Owner) groupOf(name string) int {
	if t := o.table.Load(); t != nil {
		return api.RateGroupIn(name, t)
	}
	return api.RateGroup(name, o.p, o.g)
}

// groups is the group count tenants are routed over.
func (o *Owner) groups() int {
	if t := o.table.Load(); t != nil {
		return t.Groups
	}
	return o.g
}

// SetLayout routes tenants by t from now on (a raise's partition moves): each
// tenant whose partition moved to a group this node does not lead stops being
// owned here at the next tick, and its clients are told it moved; the new
// group's leader takes it over as after a leader change (its window rebuilt
// from the clients' reports, guarded until they are in), or, for a sliding
// key, from its previous owner's hand-off (handoff.go). now stamps the
// change (a key it moved is fetched for handoffFor). A table of other
// partition count, or older than the one held, is ignored (false).
func (o *Owner) SetLayout(t *layout.Table, now time.Time) bool {
	if t == nil || t.Partitions() != o.p {
		return false
	}
	o.tickMu.Lock()
	defer o.tickMu.Unlock()
	cur := o.table.Load()
	if cur != nil && t.Epoch <= cur.Epoch {
		return false
	}
	if cur != nil {
		// (The first table is what this node found at its start, not a
		// move it saw happen: no key is fetched for it.)
		o.noteMove(cur, t, now.UnixNano())
	}
	o.table.Store(t)
	for k := range o.shards {
		sh := &o.shards[k]
		sh.mu.Lock()
		for _, ts := range sh.list {
			ts.group = api.RateGroupIn(ts.name, t)
		}
		sh.mu.Unlock()
	}
	return true
}

// Owned reports whether this node owns the tenant's rate state now: it knows
// the tenant and its last round found it leading the tenant's group.
func (o *Owner) Owned(name string) bool {
	sh := &o.shards[o.shardOf(name)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tenants[name]
	return t != nil && t.owned
}
