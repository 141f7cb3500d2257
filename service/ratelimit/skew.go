package ratelimit

import (
	"math"
)

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
	t.guardUntil, t.takeover, t.guardShares = ns+int64(o.cfg.TakeoverGuard), false, 0
}
