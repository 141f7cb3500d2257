package ratelimit

import (
	"slices"
	"sort"
	"time"
)

// tickCount is what one tick folded in for a tenant.
type tickCount struct {
	at     int64
	tokens float64
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

// seedRecent adds to recent what a client that reports for the first time
// in a takeover admitted in the last second by its window slices (less
// asked, newest first), each stamped at its slice's end, as
// slidingState.seed places them: the guard's one-second cap then counts
// the second the old owner's leases filled. Without slices (a client that
// predates them) nothing is added: the guard alone holds it.
func (t *tenantState) seedRecent(e *entry, ns int64, asked float64) {
	if e.sliceK == 0 || t.window <= 0 {
		return
	}
	sw := t.window / e.sliceK
	end := min(e.absorbedAt, ns)
	for j, c := range e.slices {
		n := float64(c)
		take := min(n, asked)
		n, asked = n-take, asked-take
		at := end
		if j > 0 {
			at = end - e.sliceAge - int64(j-1)*sw
		}
		if n <= 0 || at <= ns-int64(time.Second) {
			continue
		}
		i := sort.Search(len(t.recent), func(i int) bool { return t.recent[i].at >= at })
		if i < len(t.recent) && t.recent[i].at == at {
			t.recent[i].tokens += n
		} else {
			t.recent = slices.Insert(t.recent, i, tickCount{at: at, tokens: n})
		}
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
		// admit up to twice the limit. Each client keeps its guard rate
		// (its lease share of the limit, fold), as a budget since its
		// first report, so the part of a lease too small for a whole
		// request carries over.
		since := float64(t.tickAt-e.guardFrom)/1e9 + dt
		budget := e.guardBase + uint64(e.guardRate*since)
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
