package ratelease

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Strategy selects how a client decides from what the owner streams back.
type Strategy int

const (
	// Lease (the default): the owner runs one token bucket per tenant and
	// grants each client a cap on its own cumulative consumption, sized by the
	// client's recent demand. Σ leases ≤ what the bucket holds, so admitted
	// traffic stays at the limit however many clients carry it.
	Lease Strategy = iota + 1
	// Blocklist is the Cortex-style baseline: a sliding window of two fixed
	// buckets on the owner; a tenant over its limit is blocked for the classic
	// blocked-for duration and everything else is admitted.
	Blocklist
	// Local is the classic strategy: a local token bucket of limit ÷ active
	// clients, the count coming from the owner.
	Local
)

func (s Strategy) String() string {
	switch s {
	case Lease:
		return "lease"
	case Blocklist:
		return "blocklist"
	case Local:
		return "local"
	}
	return fmt.Sprintf("strategy(%d)", int(s))
}

// ParseStrategy reads "lease", "blocklist" or "local".
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range []Strategy{Lease, Blocklist, Local} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("rate-limit strategy %q: want lease, blocklist or local", s)
}

func (s Strategy) wire() api.RateStrategy {
	switch s {
	case Blocklist:
		return api.RateStrategy_RATE_STRATEGY_BLOCKLIST
	case Local:
		return api.RateStrategy_RATE_STRATEGY_LOCAL
	}
	return api.RateStrategy_RATE_STRATEGY_LEASE
}

// Reasons of a decision, the "reason" label of the decision metric.
const (
	reasonWithinLimit  = iota // allowed: the strategy's rule admitted it
	reasonNoLimit             // allowed: the tenant has no rate limit
	reasonNoState             // allowed: no update from the owner yet (first report period of a tenant)
	reasonFailOpen            // allowed: the owner has been silent longer than StaleAfter
	reasonOwner               // allowed: the owner admitted it when asked (Ask)
	reasonBlocklist           // blocked: tenant on the blocklist
	reasonLease               // blocked: lease exhausted
	reasonLocalBucket         // blocked: local token bucket empty
	reasonFailClosed          // blocked: owner silent and FailClosed
	reasonOwnerRefused        // blocked: the owner refused it when asked, or was just asked and refused (Ask)
	reasonNoGrant             // blocked: no lease and the owner could not be asked
	numReasons
)

var reasonNames = [numReasons]string{"within_limit", "no_limit", "no_state", "fail_open", "owner", "blocklist", "lease_exhausted", "local_bucket", "fail_closed", "owner_refused", "no_grant"}

func reasonAllowed(r int) bool { return r < reasonBlocklist }

// Tenant modes, refreshed by Tick so Allow needs no clock on most paths.
const (
	modeNoState int32 = iota // no update yet
	modeLimited              // updates are fresh, the tenant has a limit
	modeNoLimit              // updates are fresh, no limit
	modeStale                // no update for StaleAfter
)

// LimiterConfig configures the transport-free core.
type LimiterConfig struct {
	Strategy Strategy // default Lease
	// StaleAfter: a tenant whose owner sent nothing for this long is decided by
	// FailClosed (default 5s). Before that, a Lease client keeps admitting at
	// its last lease rate and a Blocklist client keeps its blocklist.
	StaleAfter time.Duration
	// FailClosed rejects stale tenants instead of admitting them (fail open is
	// the default: an unreachable limiter must not stop ingestion).
	FailClosed bool
	// Now is the clock (default time.Now); tests pass a simulated one.
	Now func() time.Time
	// ClientID identifies this client to owners; 0 picks a random one.
	ClientID uint64
}

// Limiter is the decision core of a client: Allow, the report it sends and the
// updates it applies. It does no I/O (Client adds the transport), so strategies
// are tested against a simulated clock.
type Limiter struct {
	cfg LimiterConfig
	now func() time.Time

	tenants atomic.Pointer[map[string]*tenant] // copy-on-write: Allow reads without a lock
	mu      sync.Mutex                         // serialises inserts
	byID    atomic.Pointer[[]*tenant]          // id-1 → tenant

	// report state, owned by the goroutine that calls Tick/Report (reportMu)
	reportMu sync.Mutex
	// lastTick is the clock reading of the last Tick (unix ns): bucket counts
	// are as of then, and reports give their buckets' age from it.
	lastTick int64
}

type tenant struct {
	name string
	id   uint32

	mode     atomic.Int32
	consumed atomic.Uint64 // admitted tokens since start
	// rejected tokens since start: offered = consumed + rejected, so the
	// admitting path touches one counter less.
	rejected atomic.Uint64
	// borrowed: tokens the owner admitted when asked (Ask). They are
	// counted on the owner when it admits them, so they stay out of
	// consumed (the reports' admissions) but count as offered.
	borrowed atomic.Uint64
	decided  [numReasons]atomic.Uint64
	// noAskUntil: unix ns before which Ask refuses without asking (the
	// owner just refused); askRemaining, askNextFree: its last answer.
	noAskUntil   atomic.Int64
	askRemaining atomic.Uint64
	askNextFree  atomic.Int64 // unix ns

	// from the owner's last update
	limitBits    atomic.Uint64 // float64 tokens/s
	burst        atomic.Uint64
	windowNanos  atomic.Int64
	blockedUntil atomic.Int64  // unix ns; 0 = not blocked
	leaseCap     atomic.Uint64 // Lease: admit while consumed ≤ cap
	leaseRate    atomic.Uint64 // float64 tokens/s, extension of the cap when updates stop
	grantAt      atomic.Int64  // unix ns of the update carrying leaseCap
	grantEvery   atomic.Int64  // ns between the last two grants, at most leaseGrace; 0 = one grant yet
	updatedAt    atomic.Int64  // unix ns of the last update; 0 = none
	firstSeen    int64

	local localBucket

	// report-side bookkeeping (reportMu)
	lastConsumed uint64
	lastBorrowed uint64
	bucketStart  int64
	bucketCur    uint64
	bucketPrev   uint64
	// The last window by age in WindowSlices slices of sliceW (the window
	// ÷ WindowSlices) each, slices[i mod WindowSlices] counting slice i of
	// this clock (ns ÷ sliceW); sliceIdx is the current one. Reports send
	// them with the buckets: a new owner places them on its clock finer
	// than two buckets allow (docs/ratelimits.md, Takeover).
	slices   [WindowSlices]uint64
	sliceIdx int64
	sliceW   int64
}

// WindowSlices is how many slices of its window a report's window_slices
// gives per tenant: a new owner counts a token until the end of its slice,
// so its window frees tokens at most window ÷ WindowSlices late (3% of it).
const WindowSlices = 32

// localBucket is the Local strategy's token bucket. Tick refills it (once per
// report period) so Allow reads no clock: on some VMs a clock read costs more
// than the whole decision.
type localBucket struct {
	tokens atomic.Int64 // whole tokens
	mu     sync.Mutex   // rate, burst, frac, last (Tick and Apply)
	rate   float64
	burst  float64
	frac   float64 // refill below one token, carried over
	last   int64
	sized  bool
}

// NewLimiter returns a core with no tenants.
func NewLimiter(cfg LimiterConfig) (*Limiter, error) {
	if cfg.Strategy == 0 {
		cfg.Strategy = Lease
	}
	if cfg.Strategy < Lease || cfg.Strategy > Local {
		return nil, fmt.Errorf("ratelimit: unknown strategy %d", cfg.Strategy)
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = 5 * time.Second
	}
	if cfg.StaleAfter < 0 {
		return nil, fmt.Errorf("ratelimit: stale-after %v must be > 0", cfg.StaleAfter)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ClientID == 0 {
		cfg.ClientID = randomID()
	}
	l := &Limiter{cfg: cfg, now: cfg.Now}
	m := map[string]*tenant{}
	l.tenants.Store(&m)
	ids := []*tenant{}
	l.byID.Store(&ids)
	return l, nil
}

// Keys is how many keys (tenants) the limiter has seen.
func (l *Limiter) Keys() int { return len(*l.byID.Load()) }

// Strategy is the strategy this limiter decides with.
func (l *Limiter) Strategy() Strategy { return l.cfg.Strategy }

// ClientID is the id this limiter reports under.
func (l *Limiter) ClientID() uint64 { return l.cfg.ClientID }

// Allow decides locally whether n tokens of tenant may go in, and counts them.
// It makes no network call and does not allocate once the tenant is known.
func (l *Limiter) Allow(tenant string, n int) bool {
	t := (*l.tenants.Load())[tenant]
	if t == nil {
		t = l.add(tenant)
	}
	if n < 0 {
		n = 0
	}
	r := l.decide(t, uint64(n))
	t.decided[r].Add(1)
	return reasonAllowed(r)
}

// Decision is what Decide reports beside yes/no.
type Decision struct {
	Allowed bool
	// Limited: the owner sent a limit for the key and updates are fresh, so
	// Remaining is meaningful. False while no update arrived yet, after the
	// owner went silent (fail open/closed) or when the key has no limit.
	Limited bool
	// Remaining is how many more tokens this process may admit for the key
	// before it needs the owner's next lease (Lease strategy; 0 for the
	// others): a local figure, never more than the limit's burst.
	Remaining uint64
}

// Decide decides like Allow and also reports what is left of the key's local
// lease, for callers that tell their own clients (the Envoy rate limit
// service's limit_remaining).
func (l *Limiter) Decide(key string, n uint64) Decision {
	t := (*l.tenants.Load())[key]
	if t == nil {
		t = l.add(key)
	}
	r := l.decide(t, n)
	t.decided[r].Add(1)
	d := Decision{Allowed: reasonAllowed(r), Limited: t.mode.Load() == modeLimited}
	if d.Limited && l.cfg.Strategy == Lease {
		c, capv := t.consumed.Load(), t.leaseCap.Load()
		if capv > c {
			d.Remaining = min(capv-c, t.burst.Load())
		}
	}
	return d
}

// Handle is one tenant of a Limiter, looked up once: Handle.Allow skips the
// tenant map, for callers that keep a handle per tenant (a connection bound
// to one tenant, say). It shares every counter with Allow(tenant, n).
type Handle struct {
	l *Limiter
	t *tenant
}

// Tenant returns the handle of a tenant, registering it if new.
func (l *Limiter) Tenant(name string) *Handle {
	t := (*l.tenants.Load())[name]
	if t == nil {
		t = l.add(name)
	}
	return &Handle{l: l, t: t}
}

// Allow decides like Limiter.Allow for the handle's tenant.
func (h *Handle) Allow(n int) bool {
	if n < 0 {
		n = 0
	}
	r := h.l.decide(h.t, uint64(n))
	h.t.decided[r].Add(1)
	return reasonAllowed(r)
}

func (l *Limiter) decide(t *tenant, n uint64) int {
	r := l.decideAdmit(t, n)
	if !reasonAllowed(r) {
		t.rejected.Add(n)
	}
	return r
}

// decideAdmit decides and, when it admits, counts the tokens consumed.
func (l *Limiter) decideAdmit(t *tenant, n uint64) int {
	mode := t.mode.Load()
	if mode == modeLimited && l.cfg.Strategy == Lease {
		// The hot path: one load of the cap, one compare-and-swap.
		for {
			c := t.consumed.Load()
			limit := t.leaseCap.Load()
			// n > limit-c, not c+n > limit: a huge n must not wrap.
			if c > limit || n > limit-c {
				limit = t.extendedCap(l.now().UnixNano(), limit)
				if c > limit || n > limit-c {
					return reasonLease
				}
			}
			if t.consumed.CompareAndSwap(c, c+n) {
				return reasonWithinLimit
			}
		}
	}
	switch mode {
	case modeNoLimit:
		t.consumed.Add(n)
		return reasonNoLimit
	case modeNoState:
		t.consumed.Add(n)
		return reasonNoState
	case modeStale:
		if l.cfg.FailClosed {
			return reasonFailClosed
		}
		t.consumed.Add(n)
		return reasonFailOpen
	}
	switch l.cfg.Strategy {
	case Blocklist:
		if bu := t.blockedUntil.Load(); bu != 0 && l.now().UnixNano() < bu {
			return reasonBlocklist
		}
		t.consumed.Add(n)
		return reasonWithinLimit
	case Local:
		if !t.local.take(n) {
			return reasonLocalBucket
		}
		t.consumed.Add(n)
		return reasonWithinLimit
	}
	return reasonWithinLimit // unreachable: Lease with modeLimited is above
}

// offeredTotal is admitted + rejected tokens since start.
func (t *tenant) offeredTotal() uint64 {
	return t.consumed.Load() + t.rejected.Load() + t.borrowed.Load()
}

// leaseGrace is how long past a lease's grant a client waits for the next
// update before extending the cap at its lease rate: an update is due every
// report period (100 ms), so only a missing owner (failover) or one running
// late gets this far. An owner merely late costs at most its lateness × the
// lease rate, charged to the tenant's bucket when its reports arrive.
const leaseGrace = 150 * time.Millisecond

// extendedCap lets a Lease client keep admitting at its share of the tenant's
// refill while updates are late (owner failover), instead of stopping dead:
// the shares of all clients sum to the limit, so this does not overshoot.
//
// The extension counts from when the cap ran out, not from the end of the
// grace: a scarce lease covers one grant interval (a period's refill at
// the client's share), so counting from the grace's end left a hole of
// grace − interval at the lease rate in the second of an owner's death
// (0.87–0.95× of a busy key's limit on the simulated clock,
// TestSmallKeyTakeover; with a 300-ms grace 0.73–0.90×). At the grace's
// end the client gets that stretch at once, so over the outage it admits
// exactly its share, as the new owner's takeover guard assumes of a client
// it has not heard from. The interval is the last one seen between grants
// (capped at the grace; with one grant only, the grace).
func (t *tenant) extendedCap(now int64, limit uint64) uint64 {
	at := t.grantAt.Load()
	if now-at <= int64(leaseGrace) {
		return limit
	}
	cover := t.grantEvery.Load()
	if cover <= 0 {
		cover = int64(leaseGrace)
	}
	rate := math.Float64frombits(t.leaseRate.Load())
	ext := rate * float64(now-at-cover) / 1e9
	if ext >= float64(math.MaxUint64-limit) {
		return math.MaxUint64
	}
	return limit + uint64(ext)
}

// leaseShare is the part of the limit this client may keep admitting at
// when its updates stop (extendedCap), 0 to 1, for the report a new owner
// reads; -1 when it holds no lease (no grant yet, another strategy).
func (t *tenant) leaseShare() float64 {
	limit := math.Float64frombits(t.limitBits.Load())
	if t.grantAt.Load() == 0 || !(limit > 0) {
		return -1
	}
	return min(1, max(0, math.Float64frombits(t.leaseRate.Load())/limit))
}

func (b *localBucket) take(n uint64) bool {
	for {
		v := b.tokens.Load()
		if v < int64(n) {
			return false
		}
		if b.tokens.CompareAndSwap(v, v-int64(n)) {
			return true
		}
	}
}

func (b *localBucket) refill(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last != 0 && now > b.last && b.sized {
		add := b.rate*float64(now-b.last)/1e9 + b.frac
		whole := math.Floor(add)
		b.frac = add - whole
		for {
			v := b.tokens.Load()
			nv := min(int64(b.burst), v+int64(whole))
			if b.tokens.CompareAndSwap(v, nv) {
				break
			}
		}
	}
	b.last = now
}

func (b *localBucket) resize(rate, burst float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.sized {
		b.tokens.Store(int64(burst)) // a new bucket starts full, like x/time/rate
		b.sized = true
	}
	b.rate, b.burst = rate, burst
	if v := b.tokens.Load(); v > int64(burst) {
		b.tokens.CompareAndSwap(v, int64(burst))
	}
}

// add registers a tenant on its first Allow (slow path: copies the map).
func (l *Limiter) add(name string) *tenant {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.tenants.Load()
	if t := old[name]; t != nil {
		return t
	}
	ids := *l.byID.Load()
	t := &tenant{name: name, id: uint32(len(ids) + 1), firstSeen: l.now().UnixNano()}
	m := make(map[string]*tenant, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = t
	nids := append(ids[:len(ids):len(ids)], t)
	l.byID.Store(&nids)
	l.tenants.Store(&m)
	return t
}

func (l *Limiter) tenantByID(id uint32) *tenant {
	ids := *l.byID.Load()
	if id == 0 || int(id) > len(ids) {
		return nil
	}
	return ids[id-1]
}

// Tick advances the report-side bookkeeping to now: attributes what was
// admitted since the last tick to the current window bucket, and marks
// tenants whose owner has been silent for StaleAfter. Call it once per report
// period, before building reports.
func (l *Limiter) Tick(now time.Time) {
	l.reportMu.Lock()
	defer l.reportMu.Unlock()
	ns := now.UnixNano()
	l.lastTick = ns
	stale := int64(l.cfg.StaleAfter)
	for _, t := range *l.byID.Load() {
		c := t.consumed.Load()
		d := c - t.lastConsumed
		t.lastConsumed = c
		leased := d // the owner's answers are in the slices already (Answered)
		// The window buckets count what the owner admitted on request
		// too: a new owner seeds its window from them (a takeover).
		b := t.borrowed.Load()
		d += b - t.lastBorrowed
		t.lastBorrowed = b
		w := t.windowLen()
		start := ns - ns%w
		switch {
		case start == t.bucketStart:
		case start == t.bucketStart+w:
			t.bucketPrev, t.bucketCur = t.bucketCur, 0
		default:
			t.bucketPrev, t.bucketCur = 0, 0
		}
		t.bucketStart = start
		t.bucketCur += d
		t.addSlice(ns, w, leased)

		if l.cfg.Strategy == Local {
			t.local.refill(ns)
		}
		// Apply sets the mode back when an update arrives.
		if ns-max(t.updatedAt.Load(), t.firstSeen) > stale {
			t.mode.Store(modeStale)
		}
	}
}

// windowLen is the window the owner last sent (a second before any).
func (t *tenant) windowLen() int64 {
	if w := t.windowNanos.Load(); w > 0 {
		return w
	}
	return int64(time.Second)
}

// addSlice counts d tokens, admitted no later than ns, in the slices of the
// window w. A new window length (the limit changed, or the first update
// came) moves what the slices held into the current one: counted later
// than admitted, which a new owner may only do in that direction.
func (t *tenant) addSlice(ns, w int64, d uint64) {
	sw := max(1, w/WindowSlices)
	idx := max(0, ns/sw)
	if sw == t.sliceW && idx < t.sliceIdx {
		idx = t.sliceIdx // the clock stepped back: counted in the later slice
	}
	switch {
	case sw != t.sliceW:
		var sum uint64
		for i := range t.slices {
			sum, t.slices[i] = sum+t.slices[i], 0
		}
		t.slices[idx%WindowSlices] = sum
		t.sliceW = sw
	case idx > t.sliceIdx:
		for k := t.sliceIdx + 1; k <= min(idx, t.sliceIdx+WindowSlices); k++ {
			t.slices[k%WindowSlices] = 0
		}
	}
	t.sliceIdx = idx
	t.slices[idx%WindowSlices] += d
}

// WindowTokens is what the window slices hold for key: its admissions over
// about the last window, as of the last tick and the owner's answers since.
func (l *Limiter) WindowTokens(key string) uint64 {
	t := (*l.tenants.Load())[key]
	if t == nil {
		return 0
	}
	l.reportMu.Lock()
	defer l.reportMu.Unlock()
	var sum uint64
	for j := range int64(WindowSlices) {
		sum += t.slice(j)
	}
	return sum
}

// slice is the count of the slice j before the current one (j < WindowSlices).
func (t *tenant) slice(j int64) uint64 {
	if t.sliceW == 0 || j > t.sliceIdx {
		return 0
	}
	return t.slices[(t.sliceIdx-j)%WindowSlices]
}

// ReportState is per-stream memory of which tenant names the peer knows.
type ReportState struct {
	introduced []bool
	first      bool
	// lastIn[id] is the report number that last carried tenant id: a tenant
	// absent from the previous report joined the stream, and the report then
	// carries bucket counts (the owner seeds from them; otherwise they are
	// left out, which is most of a report's size).
	lastIn []uint64
	n      uint64
}

// NewReportState starts a stream: its first report carries the client id and
// every tenant name it mentions.
func NewReportState() *ReportState { return &ReportState{first: true} }

// Report builds the report of the tenants include accepts (all when nil) for
// one stream. Counts are cumulative, so a lost report loses nothing.
func (l *Limiter) Report(st *ReportState, include func(name string) bool) *api.RateReport {
	l.reportMu.Lock()
	defer l.reportMu.Unlock()
	rep := &api.RateReport{}
	st.n++
	joined := false
	if st.first {
		rep.ClientId = l.cfg.ClientID
		rep.Strategy = l.cfg.Strategy.wire()
		st.first = false
	}
	for _, t := range *l.byID.Load() {
		if include != nil && !include(t.name) {
			continue
		}
		if int(t.id) >= len(st.introduced) {
			st.introduced = append(st.introduced, make([]bool, int(t.id)+1-len(st.introduced))...)
			st.lastIn = append(st.lastIn, make([]uint64, int(t.id)+1-len(st.lastIn))...)
		}
		if st.lastIn[t.id] == 0 || st.lastIn[t.id]+1 != st.n {
			joined = true
		}
		st.lastIn[t.id] = st.n
		if !st.introduced[t.id] {
			st.introduced[t.id] = true
			rep.NewIds = append(rep.NewIds, t.id)
			rep.NewNames = append(rep.NewNames, t.name)
		}
		rep.Ids = append(rep.Ids, t.id)
		rep.ConsumedTotal = append(rep.ConsumedTotal, t.lastConsumed)
		rep.OfferedTotal = append(rep.OfferedTotal, t.lastConsumed+t.rejected.Load()+t.borrowed.Load())
	}
	if joined {
		n := len(rep.Ids)
		rep.BucketStartUnixNanos, rep.BucketConsumed, rep.PrevBucketConsumed = make([]int64, 0, n), make([]uint64, 0, n), make([]uint64, 0, n)
		rep.BucketAgeNanos = make([]int64, 0, n)
		rep.SlicesPerWindow, rep.WindowSliceLen, rep.SliceAgeNanos = WindowSlices, make([]uint32, 0, n), make([]int64, 0, n)
		rep.LeaseShare = make([]float64, 0, n)
		for _, id := range rep.Ids {
			t := l.tenantByID(id)
			// The age is a difference of two readings of this client's
			// clock, so the owner can place the counts on its own clock
			// whatever this one's wall clock says. A tenant not yet ticked
			// has no bucket (and no counts): age 0.
			var age int64
			if t.bucketStart != 0 {
				age = max(0, l.lastTick-t.bucketStart)
			}
			rep.BucketAgeNanos = append(rep.BucketAgeNanos, age)
			rep.LeaseShare = append(rep.LeaseShare, t.leaseShare())
			rep.BucketStartUnixNanos = append(rep.BucketStartUnixNanos, t.bucketStart)
			rep.BucketConsumed = append(rep.BucketConsumed, t.bucketCur)
			rep.PrevBucketConsumed = append(rep.PrevBucketConsumed, t.bucketPrev)
			// The newest slices up to the oldest non-zero one: an idle
			// tenant (most of a big client's) costs two bytes.
			k := int64(WindowSlices)
			for k > 0 && t.slice(k-1) == 0 {
				k--
			}
			var sAge int64
			if k > 0 {
				sAge = max(0, l.lastTick-t.sliceIdx*t.sliceW)
			}
			rep.SliceAgeNanos = append(rep.SliceAgeNanos, sAge)
			rep.WindowSliceLen = append(rep.WindowSliceLen, uint32(k))
			for j := range k {
				rep.WindowSlices = append(rep.WindowSlices, t.slice(j))
			}
		}
	}
	return rep
}

// Apply takes an update from an owner at time now. It returns the tenants the
// sender does not own (route them to their group's leader, u.Redirects names
// it when known), or an error for a malformed update (nothing applied).
func (l *Limiter) Apply(u *api.RateUpdate, now time.Time) ([]string, error) {
	n := len(u.Ids)
	// limit, burst and window come only when they changed (all three or none).
	withLimits := len(u.Limit) > 0 || len(u.Burst) > 0 || len(u.WindowNanos) > 0
	if (withLimits && (len(u.Limit) != n || len(u.Burst) != n || len(u.WindowNanos) != n)) ||
		(len(u.BlockedForNanos) != 0 && len(u.BlockedForNanos) != n) ||
		(len(u.Cap) != 0 && len(u.Cap) != n) || len(u.LeaseRate) != len(u.Cap) {
		return nil, fmt.Errorf("ratelimit: malformed update: %d ids, %d limits, %d bursts, %d windows, %d blocked, %d caps, %d lease rates",
			n, len(u.Limit), len(u.Burst), len(u.WindowNanos), len(u.BlockedForNanos), len(u.Cap), len(u.LeaseRate))
	}
	ns := now.UnixNano()
	active := max(1, float64(u.ActiveClients))
	for i, id := range u.Ids {
		t := l.tenantByID(id)
		if t == nil {
			continue // not ours: ignore rather than fail the stream
		}
		if withLimits {
			t.limitBits.Store(math.Float64bits(u.Limit[i]))
			t.burst.Store(u.Burst[i])
			t.windowNanos.Store(u.WindowNanos[i])
		}
		limit := math.Float64frombits(t.limitBits.Load())
		if len(u.BlockedForNanos) > 0 {
			if bf := u.BlockedForNanos[i]; bf > 0 {
				t.blockedUntil.Store(ns + bf)
			} else {
				t.blockedUntil.Store(0)
			}
		}
		if len(u.Cap) > 0 {
			t.leaseRate.Store(math.Float64bits(u.LeaseRate[i]))
			if prev := t.grantAt.Load(); prev != 0 && ns > prev {
				t.grantEvery.Store(min(ns-prev, int64(leaseGrace)))
			}
			t.grantAt.Store(ns)
			t.leaseCap.Store(u.Cap[i])
		}
		if l.cfg.Strategy == Local && limit > 0 {
			t.local.resize(limit/active, max(float64(t.burst.Load())/active, 1))
		}
		t.updatedAt.Store(ns)
		if limit > 0 {
			t.mode.Store(modeLimited)
		} else {
			t.mode.Store(modeNoLimit)
		}
	}
	var moved []string
	for _, id := range u.MovedIds {
		if t := l.tenantByID(id); t != nil {
			moved = append(moved, t.name)
		}
	}
	return moved, nil
}

// TenantStats are one tenant's counters as this client sees them.
type TenantStats struct {
	Tenant      string
	AllowedBy   map[string]uint64 // requests, by reason
	BlockedBy   map[string]uint64 // requests, by reason
	Consumed    uint64            // admitted tokens
	Offered     uint64            // admitted + rejected tokens
	Limit       float64           // tokens/s from the owner; 0 = none or unknown
	OnBlocklist bool              // blocked now (Blocklist strategy)
	Stale       bool              // owner silent longer than StaleAfter
	HasUpdate   bool              // an update was received
}

// TenantStats returns counters for every tenant seen, in first-seen order.
func (l *Limiter) TenantStats() []TenantStats {
	ns := l.now().UnixNano()
	var out []TenantStats
	for _, t := range *l.byID.Load() {
		ts := TenantStats{Tenant: t.name, AllowedBy: map[string]uint64{}, BlockedBy: map[string]uint64{},
			Consumed: t.consumed.Load(), Offered: t.offeredTotal(), Limit: math.Float64frombits(t.limitBits.Load()),
			OnBlocklist: t.blockedUntil.Load() > ns, Stale: t.mode.Load() == modeStale, HasUpdate: t.updatedAt.Load() != 0}
		for r := range numReasons {
			v := t.decided[r].Load()
			if v == 0 {
				continue
			}
			if reasonAllowed(r) {
				ts.AllowedBy[reasonNames[r]] = v
			} else {
				ts.BlockedBy[reasonNames[r]] = v
			}
		}
		out = append(out, ts)
	}
	return out
}
