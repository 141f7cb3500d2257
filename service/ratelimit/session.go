package ratelimit

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

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
	// slices (when sliceK > 0) are the client's admitted tokens in the
	// last window by age, newest first, in slices of window ÷ sliceK (the
	// older ones zero); the newest had run sliceAge
	// (api.RateReport.window_slices).
	slices           []uint64
	sliceK, sliceAge int64
	// leaseShare: the part of the limit the client last held as its lease
	// rate under an earlier owner (api.RateReport.lease_share); < 0:
	// none, or a client that predates it.
	leaseShare float64
	reported   bool
	reportedAt int64 // unix ns of the last report
	moved      bool  // reported while not owned here: list in moved_ids once
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
	// guardRate: tokens/s this client may admit at during a takeover
	// guard: its lease share of the limit, or (a client that predates
	// lease_share) what it admitted in the window before its first report
	// to this owner plus Headroom; < 0: not held.
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
	// lease_share is newer still, with the bucket counts.
	if len(r.LeaseShare) > 0 && (!withBuckets || len(r.LeaseShare) != n) {
		return fmt.Errorf("%w: lease_share (%d) must be one per id (%d ids), with the bucket counts", ErrInvalid, len(r.LeaseShare), n)
	}
	for i, f := range r.LeaseShare {
		if !(f >= -1 && f <= 1) { // NaN fails both
			return fmt.Errorf("%w: lease_share[%d] = %v, want -1 (no lease) or 0 to 1", ErrInvalid, i, f)
		}
	}
	// The window slices are newer still, with the bucket counts.
	withSlices := r.SlicesPerWindow > 0 || len(r.WindowSliceLen) > 0 || len(r.WindowSlices) > 0 || len(r.SliceAgeNanos) > 0
	if withSlices {
		if !withBuckets || len(r.WindowSliceLen) != n || len(r.SliceAgeNanos) != n {
			return fmt.Errorf("%w: window_slice_len (%d) and slice_age_nanos (%d) must be one per id (%d ids), with the bucket counts", ErrInvalid, len(r.WindowSliceLen), len(r.SliceAgeNanos), n)
		}
		if r.SlicesPerWindow < 1 || r.SlicesPerWindow > maxWindowSlices {
			return fmt.Errorf("%w: slices_per_window = %d, want 1 to %d", ErrInvalid, r.SlicesPerWindow, maxWindowSlices)
		}
		total := 0
		for i, l := range r.WindowSliceLen {
			if l > r.SlicesPerWindow {
				return fmt.Errorf("%w: window_slice_len[%d] = %d is more than slices_per_window %d", ErrInvalid, i, l, r.SlicesPerWindow)
			}
			total += int(l)
		}
		if total != len(r.WindowSlices) {
			return fmt.Errorf("%w: window_slice_len adds up to %d, window_slices has %d", ErrInvalid, total, len(r.WindowSlices))
		}
		for i, a := range r.SliceAgeNanos {
			if a < 0 {
				return fmt.Errorf("%w: slice_age_nanos[%d] = %d is negative", ErrInvalid, i, a)
			}
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
	off := 0 // into r.WindowSlices
	for i, id := range r.Ids {
		e := s.entry(id)
		e.consumed, e.offered = cons[i], offd[i]
		if withBuckets {
			e.bucketStart, e.bucketCur, e.bucketP = bs[i], bc[i], bp[i]
			e.hasAge, e.absorbedAt = withAges, ns
			if withAges {
				e.bucketAge = r.BucketAgeNanos[i]
			}
			e.slices, e.sliceK, e.sliceAge = e.slices[:0], 0, 0
			e.leaseShare = -1
			if len(r.LeaseShare) > 0 {
				e.leaseShare = r.LeaseShare[i]
			}
			if withSlices {
				l := int(r.WindowSliceLen[i])
				e.slices = append(e.slices, r.WindowSlices[off:off+l]...)
				e.sliceK, e.sliceAge = int64(r.SlicesPerWindow), r.SliceAgeNanos[i]
				off += l
			}
		}
		e.reported = true
		e.reportedAt = ns
	}
	return nil
}

// maxWindowSlices bounds a report's slices_per_window.
const maxWindowSlices = 1024

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
	l = slices.Insert(l, i, entry{t: t, id: id, leaseShare: -1})
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
