package ratelimit

import (
	"errors"
	"math"
	"slices"
	"sort"
	"time"
)

// Sliding-window tenants (Config.Sliding): the limit is burst tokens in any
// window of burst ÷ rate seconds (an Envoy rule's requests_per_unit per
// unit), not a token bucket. A token bucket with room for one unit admits up
// to twice the limit in a window of one unit (its full bucket, then the
// refill), and its leases, sized for a tenth of a second of demand, give a
// per-minute rule's client a fraction of a token; a sliding window has
// neither problem.
//
// The owner keeps the tokens admitted in the last window as a log of
// (time, tokens), stamped when the owner learned of them: never before they
// were admitted, so a token leaves the owner's window no earlier than it
// leaves the true one, and the owner never counts fewer than were admitted.
// (Tokens it admits itself on request are stamped askMargin ahead; what a
// new owner seeds from clients' window slices after a takeover is stamped
// at each slice's end, at most a slice late; from a client without slices,
// spread evenly over its two buckets, an estimate.) What it may hand out is the limit minus
// that count minus what clients hold (their caps' unreported remainders,
// the higher of the caps sent at the last two ticks, because a lowered cap
// is in force only once the client has it: updates arrive within a period,
// in order). Leases are sized by demand alone (two periods of it, plus
// Headroom, rounded down; none for a window under slidingLeaseMin): the
// rest stays with the owner, and a client whose lease does not cover a
// request asks for it (Admit) with one call. A low-rate key (a per-minute
// login limit) is then decided by the owner exactly, a busy one mostly by
// leases, and the window bound holds either way: Σ leases + Admits ≤
// limit − window count.

// slidingSlots bounds a tenant's log: tokens stamped within one
// window ÷ slidingSlots of an entry's first stamp join it, under the later
// stamp (a later expiry: still never fewer counted), so a log holds about
// that many entries and a token leaves the owner's window at most
// window ÷ slidingSlots (0.4%) after it left the true one.
const slidingSlots = 256

// ErrNotOwner: Admit on a node that does not own the tenant.
var ErrNotOwner = errors.New("rateowner: this node does not own the tenant")

// logEntry is tokens admitted no later than at, the first of them counted
// at from.
type logEntry struct {
	from, at int64
	tokens   float64
}

type slidingState struct {
	on    bool
	limit float64 // tokens per window
	win   int64   // ns
	log   []logEntry
	sum   float64 // Σ log
	// per tick: what clients hold (reserve), what their demand asks on top
	// (want), the scale of the asks granted, and the owner's bound on what
	// clients may admit without asking before the next tick (out).
	reserve, want, scale, out float64
}

// add counts tokens admitted no later than at.
func (s *slidingState) add(at int64, tokens float64) {
	if tokens <= 0 {
		return
	}
	s.sum += tokens
	if n := len(s.log); n > 0 && (s.log[n-1].at >= at || at-s.log[n-1].from < s.win/slidingSlots) {
		s.log[n-1].tokens += tokens
		s.log[n-1].at = max(s.log[n-1].at, at) // never moved earlier
		return
	}
	s.log = append(s.log, logEntry{from: at, at: at, tokens: tokens})
}

// insert counts tokens admitted no later than at, wherever at falls in
// the log (a takeover's seed: clients report one after another, each with
// its own history). It joins an entry that spans at, or the one before
// when at is within a slot of its first stamp (moved later: never fewer
// counted), else it is a new entry; the log stays ordered by stamp.
func (s *slidingState) insert(at int64, tokens float64) {
	if tokens <= 0 {
		return
	}
	s.sum += tokens
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].at >= at })
	switch {
	case i < len(s.log) && s.log[i].from <= at:
		s.log[i].tokens += tokens
	case i > 0 && at-s.log[i-1].from < s.win/slidingSlots:
		s.log[i-1].tokens += tokens
		s.log[i-1].at = at
	default:
		s.log = slices.Insert(s.log, i, logEntry{from: at, at: at, tokens: tokens})
	}
}

// trim drops what left the window ending at ns.
func (s *slidingState) trim(ns int64) {
	i := 0
	for i < len(s.log) && s.log[i].at <= ns-s.win {
		s.sum -= s.log[i].tokens
		i++
	}
	if i > 0 {
		s.log = append(s.log[:0], s.log[i:]...)
	}
	if len(s.log) == 0 || s.sum < 0 {
		s.sum = 0 // float dust
	}
}

// free is what may still be admitted now beyond what clients hold.
func (s *slidingState) free() float64 { return s.limit - s.sum - s.out }

// nextFree is how long until the oldest token in the window leaves it.
func (s *slidingState) nextFree(ns int64) time.Duration {
	if len(s.log) == 0 {
		return 0
	}
	return time.Duration(max(0, s.log[0].at+s.win-ns))
}

// seed counts a client's admissions before this owner knew of them (a
// takeover; what a client admitted failing open), less asked, what this
// owner admitted for it on request (in the log already), taken from the
// newest first. With the client's window slices, each slice's tokens are
// stamped at the slice's end: no earlier than they were admitted, at most
// a slice later. Without (a client that predates them), its two bucket
// counts are spread over the times its buckets covered, as seedByAge
// places them, in 16 parts each stamped at its end: later than admitted by
// up to a whole bucket when the client reached the limit early in it.
func (s *slidingState) seed(e *entry, ns int64, asked float64) {
	if e.sliceK > 0 {
		// The client's slices are of the window its last owner sent it,
		// the one computed here from the same limits.
		sw := s.win / e.sliceK
		end := min(e.absorbedAt, ns)
		rest := asked
		k := len(e.slices)
		counts := make([]float64, k)
		for j, c := range e.slices {
			take := min(float64(c), rest)
			counts[j], rest = float64(c)-take, rest-take
		}
		for j := k - 1; j >= 0; j-- {
			at := end // the current slice ends at the report
			if j > 0 {
				at = end - e.sliceAge - int64(j-1)*sw
			}
			if at > ns-s.win {
				s.insert(at, counts[j])
			}
		}
		return
	}
	w := e.t.window
	age := min(e.bucketAge, w)
	end := min(e.absorbedAt, ns)
	if !e.hasAge {
		age, end = min(max(0, ns-e.bucketStart), w), ns
	}
	spread := func(n float64, from, to int64) {
		if n <= 0 {
			return
		}
		const k = 16
		for i := 1; i <= k; i++ {
			at := from + (to-from)*int64(i)/k
			if at > ns-s.win {
				s.insert(at, n/k)
			}
		}
	}
	cur := float64(e.bucketCur) - asked
	prev := float64(e.bucketP) + min(0, cur)
	spread(max(0, cur), end-age, end)
	spread(max(0, prev), end-age-w, end-age)
}

// slidingFold is fold's part for a sliding tenant's entry (after the
// consumption is folded in): what the client holds and what it asks.
func (o *Owner) slidingFold(t *tenantState, e *entry, dt float64) {
	hi := max(e.cap, e.capHist[0])
	e.swReserve = 0
	if hi > e.lastConsumed {
		e.swReserve = float64(hi - e.lastConsumed)
	}
	e.swTarget = 0
	// No leases for a window under slidingLeaseMin: a lease's tokens are
	// logged when reported, up to two periods after they were admitted,
	// and leave the window that much late, a fifth of a one-second window
	// (a per-second rule at 150% admitted 0.85× of its limit).
	if e.demand*dt >= 1 && t.sw.win >= int64(slidingLeaseMin) {
		// A lease only for a client asking at least once a period: below
		// that, asking costs little, and a token leased to one node is a
		// token the others' requests cannot have.
		e.swTarget = math.Floor(e.demand * 2 * dt * (1 + o.cfg.Headroom))
	}
	// Until its grant (after every shard's tick) it is counted in out
	// as this; the grant adds its part of the asks.
	e.swCounted = e.swReserve
	t.sw.reserve += e.swReserve
	t.sw.want += max(0, e.swTarget-e.swReserve)
}

// slidingDecide sizes the tick's grants of a sliding tenant.
func (t *tenantState) slidingDecide() {
	pool := max(0, t.sw.limit-t.sw.sum-t.sw.reserve)
	t.sw.scale = 1
	if t.sw.want > pool {
		t.sw.scale = pool / t.sw.want
	}
	t.scarce = t.sw.want > pool
	t.avail = pool
	if (t.sw.reserve+t.sw.want)*slidingLeaseShare > t.sw.limit {
		// Leases grow only while all of them together would hold at
		// most 1/slidingLeaseShare of the limit. A leased token is one
		// the other nodes' requests cannot have until the lease is
		// lowered a tick later: a key asked for faster than its window
		// allows (a 20-a-minute key sent 20 requests back to back over
		// three nodes) would otherwise refuse a request while the window
		// has room, the room sitting in another node's lease (server
		// TestEnvoyRLSPerUnitSpaced, under -race: request 5 of 5 a
		// minute refused, limit_remaining 2 short). Such a key is
		// decided by its owner, exactly; a busy key's leases (two
		// periods of demand) are far under the share.
		t.sw.scale = 0
	}
	t.sw.out = t.sw.reserve + t.sw.want*t.sw.scale // Σ of the grants beyond what is held
}

// slidingGrant sets a client's cap: what it holds plus its share of the
// asks, or, when its demand fell below what it holds, its demand (the
// higher cap stays counted until the next tick).
func (o *Owner) slidingGrant(t *tenantState, e *entry) {
	var c uint64
	if e.swTarget >= e.swReserve {
		c = e.lastConsumed + uint64(e.swReserve) + uint64(math.Floor((e.swTarget-e.swReserve)*t.sw.scale))
	} else {
		c = e.lastConsumed + uint64(e.swTarget)
	}
	e.capHist[0] = e.cap
	e.cap = c
	// Its part of t.sw.out: Σ over the clients is out exactly.
	e.swCounted += max(0, e.swTarget-e.swReserve) * t.sw.scale
	share := 1 / float64(max(1, t.nClients))
	if t.sumDemand > 0 {
		share = e.demand / t.sumDemand
	}
	e.leaseRate = t.rate * share
	if t.sw.win < int64(slidingLeaseMin) {
		// No extension when updates stop (an owner failover): a window
		// that short is decided by the owner, and a client extending at
		// its share of the rate while the window is full admits up to
		// the limit again in it (1.15–1.35× of 20/s around an election,
		// faulttest TestEnvoyOwnerKill). A longer window's extension adds
		// the gap ÷ the window at most (2% of a minute for a second).
		e.leaseRate = 0
	}
}

// slidingLimits reads a sliding tenant's limit: burst tokens per
// burst ÷ rate (the window is not capped at a minute, as a bucket's is).
func slidingLimits(rate float64, burst int64) (limit float64, win int64, ok bool) {
	if rate <= 0 || burst <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return 0, 0, false
	}
	w := math.Round(float64(burst) / rate * 1e3) // ms: requests_per_unit ÷ (requests_per_unit ÷ unit) has rounding dust
	return float64(burst), int64(w) * int64(time.Millisecond), true
}

// AdmitResult is the owner's answer to Admit.
type AdmitResult struct {
	Admitted bool
	// Remaining is what could still be admitted in the window now beyond
	// what clients hold; NextFree how long until the oldest admitted token
	// leaves the window (0 when none is in it).
	Remaining uint64
	NextFree  time.Duration
	// Unseen: not decided, because the asker says it admitted tokens in
	// the window that this owner has not counted yet (its stream's first
	// report has not been folded in); ask again after NextFree.
	Unseen bool
}

// Asker is the client asking Admit: its id and, for the key, its consumed
// total and lease cap as it asks (Known false: not sent).
type Asker struct {
	ID            uint64
	Known         bool
	Consumed, Cap uint64
	// History: what the client admitted for the key over about the last
	// window, by its own count (0: nothing, or not sent).
	History uint64
}

// Admit decides n tokens of a sliding-window tenant on the owner, now: a
// client whose lease does not cover a request asks here. owned says whether
// this node leads the tenant's group (ErrNotOwner when not).
func (o *Owner) Admit(name string, n uint64, now time.Time, owned bool, from Asker) (AdmitResult, error) {
	if !owned {
		return AdmitResult{}, ErrNotOwner
	}
	ns := now.UnixNano()
	k := o.shardOf(name)
	sh := &o.shards[k]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tenants[name]
	if t == nil {
		// New here: no entry holds it (the tick forgets it when unused),
		// so no update builder reads it yet. Start it as the tick would.
		t = o.tenant(name)
		t.refs.Add(-1)
		o.reset(t, ns)
		o.startHandoff(t, ns, nil)
		t.owned = true
	}
	t.lastUse = ns
	if t.released {
		// Handed over to its new owner (Release): decided there now,
		// even if this call read the table before the move.
		return AdmitResult{}, ErrNotOwner
	}
	if t.hand.pending {
		// Its previous owner has not handed it over yet: ask again.
		return AdmitResult{NextFree: askMargin(o.cfg.Period), Unseen: true}, nil
	}
	rate, burst := o.limits(name)
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return AdmitResult{Admitted: true}, nil // no limit
	}
	limit, win, ok := slidingLimits(rate, burst)
	if !ok || o.cfg.Sliding == nil || !o.cfg.Sliding(name) {
		if !t.owned {
			// Known (a client introduced it), but the tick has not seen
			// this node own it yet, at most a period ago: no bucket yet.
			return AdmitResult{}, nil
		}
		return o.admitBucket(t, n, ns, rate, burst, from), nil
	}
	// A sliding key decides from its log alone, which the tick's
	// ownership reset leaves alone: it may be known but not yet ticked
	// as owned (a client introduced it less than a period ago).

	if !t.sw.on || t.sw.limit != limit || t.sw.win != win {
		if t.sw.win != win {
			t.sw.log, t.sw.sum = t.sw.log[:0], 0
		}
		t.sw.on, t.sw.limit, t.sw.win = true, limit, win
	}
	t.sw.trim(ns)
	if _, handed := t.hand.clients[from.ID]; !handed && float64(from.History) > t.askedBy[from.ID] && !o.askerSeen(t, from.ID) {
		// It admitted tokens in the window that this owner did not
		// admit for it and has not counted: its stream's first report
		// (which seeds them) has not come, as after a takeover, when
		// asks reach the new owner before the reports do. Deciding
		// without them could admit the limit twice; it asks again in
		// askMargin.
		return AdmitResult{NextFree: askMargin(o.cfg.Period), Unseen: true}, nil
	}
	free := t.sw.free() + o.askerRelease(t, from)
	var r AdmitResult
	if float64(n) <= free+1e-9 {
		// Stamped a period ahead: the client admits after the answer
		// reaches it, and the token must not leave the owner's window
		// before it leaves the true one.
		t.sw.add(ns+int64(askMargin(o.cfg.Period)), float64(n))
		t.noteAsked(from.ID, n)
		r.Admitted = true
	}
	if r.Admitted {
		free -= float64(n)
	}
	r.Remaining = uint64(max(0, math.Floor(free)))
	r.NextFree = t.sw.nextFree(ns)
	return r, nil
}

// askerSeen says whether a report of client id for t was folded in since
// this node owns t (its window counts seeded). (t's shard lock held.)
func (o *Owner) askerSeen(t *tenantState, id uint64) bool {
	if id == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	rec := o.clients[id]
	if rec == nil {
		return false
	}
	for _, s := range rec.live {
		s.mu.Lock()
		var es []entry
		if s.entries != nil {
			es = s.entries[t.shard]
		}
		for i := range es {
			if e := &es[i]; e.t == t && !e.superseded && e.seen && e.epoch == t.epoch {
				s.mu.Unlock()
				return true
			}
		}
		s.mu.Unlock()
	}
	return false
}

// askerRelease is what the tick counted as held by the asking client beyond
// what it can still admit from leases, now that it says where it stands:
// it asks because its lease (the cap it holds) does not cover the request,
// so what it holds is that cap, or a higher one already on its way, less
// what it consumed. The tick counted the higher of the last two caps (a
// lowered cap counts only once the client has it): without this, a client
// whose lease was just lowered could not use the tokens it gave back until
// the next tick. (t's shard lock held.)
func (o *Owner) askerRelease(t *tenantState, from Asker) float64 {
	if !from.Known || from.ID == 0 {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	rec := o.clients[from.ID]
	if rec == nil {
		return 0
	}
	for _, s := range rec.live {
		s.mu.Lock()
		var es []entry
		if s.entries != nil {
			es = s.entries[t.shard]
		}
		for i := range es {
			e := &es[i]
			if e.t != t || e.superseded || !e.seen || e.epoch != t.epoch {
				continue
			}
			// Updates arrive in order: the cap it holds is the last
			// sent, or the one before with the last on its way.
			held := from.Cap
			switch from.Cap {
			case e.cap:
			case e.capHist[0]:
				held = max(held, e.cap)
			default:
				held = max(held, e.cap, e.capHist[0])
			}
			used := max(from.Consumed, e.lastConsumed)
			now := float64(held - min(held, used))
			since := float64(used - e.lastConsumed)  // admitted since its last report: in the window now
			release := max(0, e.swCounted-since-now) // read under s.mu: a tick's grant writes swCounted
			s.mu.Unlock()
			return release
		}
		s.mu.Unlock()
	}
	return 0
}

// admitBucket is Admit for a token-bucket tenant: only a key no lease client
// holds a share of yet (a cold key: its first requests on any node) is
// admitted from the bucket here; once leases hold it, a client whose lease
// does not cover a request is over its share. A new key's bucket is armed
// for the one-second cap after idle (see Tick), so what the first askers
// take counts in its first second. (sh.mu held.)
func (o *Owner) admitBucket(t *tenantState, n uint64, ns int64, rate float64, burst int64, from Asker) AdmitResult {
	if math.IsInf(t.level, 1) {
		t.rate, t.burst = rate, float64(burst)
		if t.burst <= 0 {
			t.burst = rate
		}
		t.level, t.levelAt = t.burst, ns
		t.idleArmed = t.burst > 2*rate*o.cfg.Period.Seconds()
	}
	var r AdmitResult
	// An asker that holds no lease yet is on a cold key too, even when its
	// own report named the key to this owner a round before its ask came
	// (an ask slowed on a loaded node): it has no share to be over.
	if (t.nClients == 0 || !from.Known) && float64(n) <= t.level {
		t.level -= float64(n)
		t.addRecent(ns, float64(n))
		t.noteAsked(from.ID, n)
		r.Admitted = true
	}
	r.Remaining = uint64(max(0, math.Floor(t.level)))
	if t.nClients > 0 {
		r.Remaining = 0
	}
	if !r.Admitted && rate > 0 {
		r.NextFree = time.Duration(float64(time.Second) * min(float64(n), t.burst) / rate)
	}
	return r
}

// noteAsked counts n tokens admitted on request for a client (see
// tenantState.askedBy; the shard's lock held).
func (t *tenantState) noteAsked(client, n uint64) {
	if t.askedBy == nil {
		t.askedBy = map[uint64]float64{}
	}
	t.askedBy[client] += float64(n)
}

// slidingLeaseShare: all leases of a sliding tenant together hold at most
// 1/slidingLeaseShare of its limit (see slidingDecide).
const slidingLeaseShare = 32

// slidingLeaseMin is the shortest window whose clients get leases.
const slidingLeaseMin = 10 * time.Second

// askMargin is how far ahead of the owner's decision an asked token is
// stamped: the client admits once the answer reaches it, a millisecond or
// so later on a LAN, and the token must not leave the owner's window before
// it leaves the true one (what matters is the answers' jitter, not their
// delay). A whole period was needlessly late for a one-second window (a
// tenth of it); 20 ms still cost a busy 20/s key up to 0.15× of its limit
// in 1-second windows: at 5× offered each slot is taken again as soon as
// it frees, so every slot comes round every second plus the margin, and
// the slots, bunched since the key's first second, leave some windows
// short of several at once (0.85× at the caller, faulttest
// TestEnvoyOwnerKill; 0.95× with 5 ms).
func askMargin(period time.Duration) time.Duration { return min(period, 5*time.Millisecond) }
