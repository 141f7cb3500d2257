package rateowner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Limits gives a tenant's ingestion rate (tokens/s, 0 = no limit) and burst
// (tokens, 0 = one second's worth). The server passes today's --limits-file
// values and, later, the replicated runtime config.
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
}

// Owner is the rate state of the tenants a node owns, in memory: per tenant a
// sliding window of two fixed buckets (Blocklist) and a token bucket
// (Lease), per (client, tenant) the last cumulative counts and demand. It does
// no I/O: sessions Absorb reports, and Tick (once per period, one goroutine)
// folds them in and builds the updates.
type Owner struct {
	cfg    Config
	limits Limits
	p, g   int

	mu       sync.Mutex // tenants, sessions, clients
	tenants  map[string]*tenantState
	sessions map[*Session]struct{}
	// clients: per client id, its live sessions and the tick state of its
	// closed ones, so a client that reconnects to this node continues its
	// cumulative counts instead of being counted again (see carryOver).
	clients map[uint64]*clientRec

	// tick-goroutine state
	lastTick int64
}

// New returns an owner for a cluster of p partitions in g groups.
func New(cfg Config, p, g int, limits Limits) *Owner {
	cfg.fill()
	return &Owner{cfg: cfg, limits: limits, p: p, g: g, tenants: map[string]*tenantState{}, sessions: map[*Session]struct{}{},
		clients: map[uint64]*clientRec{}}
}

// Config returns the filled-in configuration.
func (o *Owner) Config() Config { return o.cfg }

type tenantState struct {
	name  string
	group int
	refs  int // entries pointing here (o.mu)

	// tick-owned
	owned      bool
	epoch      uint32 // bumped when this node (re)gains ownership: entries re-seed
	rate       float64
	burst      float64
	window     int64 // ns
	curStart   int64
	cur, prev  float64
	level      float64 // token bucket (Lease)
	levelAt    int64
	blockedTil int64
	// per-tick aggregates over entries
	sumDemand float64
	nClients  int
	avail     float64
	spare     float64
	scarce    bool
	lastUse   int64
}

// Session is one client's stream. Absorb is called by the stream's receive
// goroutine, Tick by the owner's; the session lock is taken once per report
// and once per tick.
type Session struct {
	o        *Owner
	mu       sync.Mutex
	started  bool
	clientID uint64
	strategy api.RateStrategy
	// entries by client-chosen tenant id, as values: Absorb and Tick walk
	// them in order without a pointer chase per tenant.
	entries []entry
	heardAt int64
	pending *api.RateUpdate // built by Tick, taken by the sender
	spare   *api.RateUpdate // sent and given back (Recycle): Tick refills it
	// resendLimits: an update carrying limits was replaced before it was
	// taken, so the next one must carry them again.
	resendLimits bool
	notify       chan struct{} // 1-buffered: an update is pending
}

// entry is one (session, tenant). t == nil marks an unused id.
type entry struct {
	t *tenantState
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
	moved                 bool // reported while not owned here: list in moved_ids once
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
	cap          uint64
	leaseRate    float64
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
	o.sessions[s] = struct{}{}
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
	delete(o.sessions, s)
	s.mu.Lock()
	defer s.mu.Unlock()
	var rec *clientRec
	if s.started {
		rec = o.clients[s.clientID]
	}
	if rec != nil {
		rec.live = slices.DeleteFunc(rec.live, func(x *Session) bool { return x == s })
	}
	now := o.lastTick
	for i := range s.entries {
		e := &s.entries[i]
		if e.t == nil {
			continue
		}
		if rec != nil && e.seen && !e.superseded {
			if rec.carry == nil {
				rec.carry = map[*tenantState]carried{}
			}
			rec.carry[e.t] = carried{tickState: e.tickState, at: now}
			e.t.refs++ // held by the carry until it is forgotten
		}
		o.release(e.t)
		*e = entry{}
	}
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
	t.refs--
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
	// New names need the owner's tenant table, whose lock Tick takes before
	// any session lock: same order here. Reports without new names (nearly
	// all) take only the session lock.
	o := s.o
	if len(r.NewIds) > 0 {
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
		if s.known(id) && s.entries[id].t.name != r.NewNames[i] {
			return fmt.Errorf("%w: tenant id %d renamed from %q to %q", ErrInvalid, id, s.entries[id].t.name, r.NewNames[i])
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
		if top >= len(s.entries) {
			s.entries = slices.Grow(s.entries, top+1-len(s.entries))[:top+1]
		}
	}
	for i, id := range r.NewIds {
		if s.known(id) {
			continue
		}
		e := &s.entries[id]
		*e = entry{t: o.tenant(r.NewNames[i])}
		o.carryOver(s, e)
	}
	ns := now.UnixNano()
	s.heardAt = ns
	cons, offd, bs, bc, bp := r.ConsumedTotal, r.OfferedTotal, r.BucketStartUnixNanos, r.BucketConsumed, r.PrevBucketConsumed
	for i, id := range r.Ids {
		e := &s.entries[id]
		e.consumed, e.offered = cons[i], offd[i]
		if withBuckets {
			e.bucketStart, e.bucketCur, e.bucketP = bs[i], bc[i], bp[i]
			e.hasAge, e.absorbedAt = withAges, ns
			if withAges {
				e.bucketAge = r.BucketAgeNanos[i]
			}
		}
		e.reported = true
	}
	return nil
}

func (s *Session) known(id uint32) bool { return int(id) < len(s.entries) && s.entries[id].t != nil }

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
		for i := range old.entries {
			oe := &old.entries[i]
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

// tenant returns (creating) a tenant's state; o.mu held.
func (o *Owner) tenant(name string) *tenantState {
	t := o.tenants[name]
	if t == nil {
		t = &tenantState{name: name, group: api.RateGroup(name, o.p, o.g)}
		o.tenants[name] = t
	}
	t.refs++
	return t
}

// Tick folds the reports absorbed since the last tick into the tenants' state,
// decides blocklists and leases, and leaves one update per session (Take).
// owns says whether this node leads a group; leaderOf names a group's leader
// for redirects. One goroutine calls Tick.
func (o *Owner) Tick(now time.Time, owns func(group int) bool, leaderOf func(group int) (id, addr string)) {
	// o.mu before lastTick: Session.Close reads it to stamp carried state.
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := now.UnixNano()
	dt := float64(o.cfg.Period) / 1e9
	if o.lastTick != 0 && ns > o.lastTick {
		dt = float64(ns-o.lastTick) / 1e9
	}
	o.lastTick = ns
	alpha := 1 - math.Exp2(-dt*1e9/float64(o.cfg.DemandHalfLife))

	ownsG := make([]bool, o.g)
	for g := range ownsG {
		ownsG[g] = owns(g)
	}
	// 1. tenants: ownership, limits, window rotation, bucket refill.
	for name, t := range o.tenants {
		if t.refs <= 0 && ns-t.lastUse > int64(o.cfg.ForgetAfter) {
			delete(o.tenants, name)
			continue
		}
		owned := ownsG[t.group]
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
		if w != t.window {
			t.window, t.cur, t.prev = w, 0, 0
			t.curStart = ns - ns%w
		}
		t.rotate(ns)
		if math.IsInf(t.level, 1) {
			t.level = t.burst // a new owner's bucket starts full; reports charge it
		}
		if t.levelAt != 0 && ns > t.levelAt {
			t.level = min(t.burst, t.level+t.rate*float64(ns-t.levelAt)/1e9)
		}
		t.levelAt = ns
		t.sumDemand, t.nClients = 0, 0
	}
	// 2. entries: deltas into windows and buckets, demand.
	// Active clients per strategy: a deployment runs one strategy, and a
	// benchmark running several side by side must not mix their counts.
	active := map[api.RateStrategy]map[uint64]struct{}{}
	for s := range o.sessions {
		s.mu.Lock()
		if s.started && ns-s.heardAt <= int64(o.cfg.ActiveAfter) {
			if active[s.strategy] == nil {
				active[s.strategy] = map[uint64]struct{}{}
			}
			active[s.strategy][s.clientID] = struct{}{}
		}
		for i := range s.entries {
			e := &s.entries[i]
			if e.t == nil || e.superseded {
				continue
			}
			o.fold(e, ns, dt, alpha)
		}
		s.mu.Unlock()
	}
	// Closed streams' state waits ForgetAfter for its client to come back.
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
	// 3. tenants: blocklist and lease budget.
	for _, t := range o.tenants {
		if !t.owned || t.rate <= 0 {
			continue
		}
		t.blockedTil = 0
		if bf := blockedFor(t.rate, float64(t.window)/1e9, float64(ns-t.curStart)/1e9, t.prev, t.cur); bf > 0 {
			t.blockedTil = ns + int64(bf*1e9)
		}
		t.avail = max(0, t.level) + t.rate*dt
		need := t.sumDemand * dt * (1 + o.cfg.Headroom)
		t.scarce = need >= t.avail
		t.spare = 0
		if !t.scarce {
			t.spare = t.avail - need
		}
	}
	// 4. sessions: updates.
	for s := range o.sessions {
		s.mu.Lock()
		if !s.started {
			s.mu.Unlock()
			continue
		}
		o.buildUpdate(s, uint32(len(active[s.strategy])), ns, dt, leaderOf)
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

// fold takes one entry's last report into its tenant's window, bucket and
// demand (tick goroutine, o.mu and the session's lock held).
func (o *Owner) fold(e *entry, ns int64, dt, alpha float64) {
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
			// Charge the bucket with what this client admitted in the
			// sliding window: at the limit, that empties it.
			t.level -= e.windowCount(t.curStart, t.window, ns)
			e.lastConsumed, e.lastOffered = e.consumed, e.offered
			e.cap = e.consumed
		}
		d := float64(e.consumed - min(e.consumed, e.lastConsumed))
		off := float64(e.offered - min(e.offered, e.lastOffered))
		e.lastConsumed, e.lastOffered = max(e.consumed, e.lastConsumed), max(e.offered, e.lastOffered)
		t.cur += d
		t.level -= d
		e.demand += alpha * (off/dt - e.demand)
	} else {
		e.demand -= alpha * e.demand
	}
	t.sumDemand += e.demand
	t.nClients++
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
	if cap(u.Ids) < len(s.entries) {
		n := len(s.entries)
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
	for id := range s.entries {
		e := &s.entries[id]
		t := e.t
		if t == nil || e.superseded {
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
			if t.rate > 0 {
				o.grant(t, e, dt)
			}
			u.Cap = append(u.Cap, e.cap)
			u.LeaseRate = append(u.LeaseRate, e.leaseRate)
		}
	}
	s.resendLimits = false
	if limitsChanged {
		for _, id := range u.Ids {
			e := &s.entries[id]
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
	t.cur, t.prev, t.window, t.curStart = 0, 0, 0, 0
	t.blockedTil = 0
	t.level, t.levelAt = math.Inf(1), ns // set to the burst once the limit is read
}

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
