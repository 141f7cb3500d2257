package gateway

import (
	"sync"
	"time"
)

// fresh remembers, per tenant, the series Tollgate accepted from this
// gateway recently, so a series sent every scrape is tracked about once per
// RefreshInterval instead of on every request.
//
// Why that keeps the limits exact: an accepted series is active in Tollgate
// and is never rejected while it stays active; Tollgate itself records at
// most one refresh per series per minute (its idle clock counts minutes), so
// tracking it more often than that changes nothing there. The gateway
// re-tracks a series 1–2 intervals after its last tracking (two
// generations), which keeps it active as long as RefreshInterval ≤ 30s and
// the idle timeout ≥ 1 minute. Only accepted series are remembered: a
// rejected one is asked again on every request (it gets in once there is
// room), and a series that went in by fail-open is not remembered either.
// What it costs: a series removed by `tollgate tenant drop` keeps being
// forwarded by a gateway that remembers it, for at most two intervals.
type fresh struct {
	every time.Duration
	max   int
	now   func() time.Time

	mu        sync.Mutex
	cur, prev map[string]map[uint64]struct{}
	n         int // entries in cur
	swapped   time.Time
}

func newFresh(every time.Duration, max int, now func() time.Time) *fresh {
	return &fresh{every: every, max: max, now: now, cur: map[string]map[uint64]struct{}{}, prev: map[string]map[uint64]struct{}{}, swapped: now()}
}

func (f *fresh) rotate() {
	if now := f.now(); now.Sub(f.swapped) >= f.every {
		f.prev, f.cur, f.n = f.cur, map[string]map[uint64]struct{}{}, 0
		if now.Sub(f.swapped) >= 2*f.every {
			f.prev = map[string]map[uint64]struct{}{} // idle for two intervals: all stale
		}
		f.swapped = now
	}
}

// stale returns the hashes not tracked for tenant within the last one or
// two intervals (the input slice itself when none is fresh).
func (f *fresh) stale(tenant string, hs []uint64) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rotate()
	cur, prev := f.cur[tenant], f.prev[tenant]
	if cur == nil && prev == nil {
		return hs
	}
	var out []uint64
	for i, h := range hs {
		_, inCur := cur[h]
		_, inPrev := prev[h]
		if inCur || inPrev {
			if out == nil {
				out = append(make([]uint64, 0, len(hs)), hs[:i]...)
			}
			continue
		}
		if out != nil {
			out = append(out, h)
		}
	}
	if out == nil {
		return hs
	}
	return out
}

// split is stale, and also picks out the series ahead: remembered from
// the previous interval only (tracked one to two intervals ago), which
// will be stale within an interval. They are marked fresh at once (so
// other requests do not pick them again) and the caller refreshes them in
// the background (forget undoes the mark when that fails). A series sent
// on every scrape is then refreshed before it falls out, and its requests
// never wait on Tollgate; only new series, and those not sent for an
// interval, are decided on their request.
//
// This is as exact as stale alone: those series are forwarded untracked
// either way (they are fresh); the background refresh only keeps them
// fresh, where stale alone would have made a later request wait for it.
func (f *fresh) split(tenant string, hs []uint64) (stale, ahead []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rotate()
	cur, prev := f.cur[tenant], f.prev[tenant]
	if cur == nil && prev == nil {
		return hs, nil
	}
	for _, h := range hs {
		if _, ok := cur[h]; ok {
			continue
		}
		if _, ok := prev[h]; !ok {
			stale = append(stale, h)
			continue
		}
		if f.n >= f.max {
			continue // full: left to go stale, as accepted leaves it
		}
		if cur == nil {
			cur = map[uint64]struct{}{}
			f.cur[tenant] = cur
		}
		cur[h] = struct{}{}
		f.n++
		ahead = append(ahead, h)
	}
	return stale, ahead
}

// forget unmarks hashes that split marked fresh, when their refresh
// failed or Tollgate rejected them.
func (f *fresh) forget(tenant string, hs []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.cur[tenant]; m != nil {
		for _, h := range hs {
			if _, ok := m[h]; ok {
				delete(m, h)
				f.n--
			}
		}
	}
}

// accepted records hashes Tollgate accepted just now (all of tracked but
// the rejected ones).
func (f *fresh) accepted(tenant string, tracked, rejected []uint64) {
	var rej map[uint64]struct{}
	if len(rejected) > 0 {
		rej = make(map[uint64]struct{}, len(rejected))
		for _, h := range rejected {
			rej[h] = struct{}{}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rotate()
	m := f.cur[tenant]
	if m == nil {
		m = map[uint64]struct{}{}
		f.cur[tenant] = m
	}
	for _, h := range tracked {
		if f.n >= f.max {
			return // full: the rest is tracked on every request until the next rotation
		}
		if _, r := rej[h]; r {
			continue
		}
		if _, ok := m[h]; !ok {
			m[h] = struct{}{}
			f.n++
		}
	}
}
