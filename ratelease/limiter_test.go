package ratelease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

func update(t *tenant, limit float64, cap uint64, rate float64) *api.RateUpdate {
	return &api.RateUpdate{ActiveClients: 1, Ids: []uint32{t.id}, Limit: []float64{limit}, Burst: []uint64{uint64(limit)},
		WindowNanos: []int64{int64(time.Second)}, Cap: []uint64{cap}, LeaseRate: []float64{rate}}
}

func TestLeaseCapAndExtension(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _ := NewLimiter(LimiterConfig{Strategy: Lease, Now: func() time.Time { return now }, StaleAfter: 5 * time.Second})
	if !l.Allow("a", 10) { // no update yet: admitted (no_state)
		t.Fatal("first call rejected")
	}
	ta := (*l.tenants.Load())["a"]
	if _, err := l.Apply(update(ta, 100, 30, 100), now); err != nil {
		t.Fatal(err)
	}
	if !l.Allow("a", 20) || l.Allow("a", 1) {
		t.Fatal("cap 30 after 10 consumed: 20 more must pass, then nothing")
	}
	// No update for 1.3 s: 1 s past the grace, the cap grows at the lease rate.
	now = now.Add(leaseGrace + time.Second)
	if !l.Allow("a", 90) || l.Allow("a", 20) {
		t.Fatal("after 1s past the grace at 100/s, about 100 more tokens must pass, not 120")
	}
	st := l.TenantStats()[0]
	if st.BlockedBy["lease_exhausted"] != 2 || st.AllowedBy["no_state"] != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestLeaseExtensionFromCapEnd: with grants 100 ms apart, a client whose
// updates stop extends from when its cap ran out (a grant interval after
// the last grant), not from the grace's end: at the grace's end it may
// admit the interval's shortfall at once, and over the outage exactly its
// lease rate.
func TestLeaseExtensionFromCapEnd(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _ := NewLimiter(LimiterConfig{Strategy: Lease, Now: func() time.Time { return now }, StaleAfter: 5 * time.Second})
	l.Allow("a", 1)
	ta := (*l.tenants.Load())["a"]
	for i := range 3 { // grants every 100 ms, 10 tokens each at 100/s
		if _, err := l.Apply(update(ta, 100, uint64(11+10*i), 100), now); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			now = now.Add(100 * time.Millisecond)
		}
	}
	if !l.Allow("a", 30) || l.Allow("a", 1) {
		t.Fatal("cap 31 after 1 consumed: 30 more must pass, then nothing")
	}
	// Inside the grace: nothing more.
	now = now.Add(leaseGrace - time.Millisecond)
	if l.Allow("a", 1) {
		t.Fatal("admitted inside the grace")
	}
	// Just past the grace: the 50 ms from the cap's end (100 ms) to the
	// grace's end (150 ms) at 100/s, 5 tokens, and no more.
	now = now.Add(2 * time.Millisecond)
	if !l.Allow("a", 5) || l.Allow("a", 1) {
		t.Fatal("just past the grace: the 5 tokens of the 50 ms since the cap ran out must pass, and no more")
	}
	// A second later: 100 more.
	now = now.Add(time.Second)
	if !l.Allow("a", 100) || l.Allow("a", 1) {
		t.Fatal("a second later at 100/s: 100 more tokens must pass, and no more")
	}
}

func TestStaleFailsOpenOrClosed(t *testing.T) {
	for _, closed := range []bool{false, true} {
		now := time.Unix(1_800_000_000, 0)
		l, _ := NewLimiter(LimiterConfig{Strategy: Blocklist, Now: func() time.Time { return now }, StaleAfter: time.Second, FailClosed: closed})
		l.Allow("a", 1)
		ta := (*l.tenants.Load())["a"]
		u := update(ta, 100, 0, 0)
		u.Cap, u.LeaseRate, u.BlockedForNanos = nil, nil, []int64{int64(10 * time.Second)}
		if _, err := l.Apply(u, now); err != nil {
			t.Fatal(err)
		}
		if l.Allow("a", 1) {
			t.Fatal("blocked tenant admitted")
		}
		now = now.Add(2 * time.Second)
		l.Tick(now)
		s := l.Stats()
		if got := l.Allow("a", 1); got == closed {
			t.Fatalf("closed=%v: stale tenant Allow = %v", closed, got)
		}
		if s.StaleTenant != 1 || s.FailingOpen == closed {
			t.Fatalf("closed=%v: stats %+v", closed, s)
		}
	}
}

func TestApplyRejectsMalformedUpdate(t *testing.T) {
	l, _ := NewLimiter(LimiterConfig{})
	l.Allow("a", 1)
	if _, err := l.Apply(&api.RateUpdate{Ids: []uint32{1}, Limit: []float64{1}}, time.Now()); err == nil {
		t.Fatal("update with missing arrays accepted")
	}
	if _, err := l.Apply(&api.RateUpdate{Ids: []uint32{1}, Cap: []uint64{1}}, time.Now()); err == nil {
		t.Fatal("update with caps but no lease rates accepted")
	}
	if _, err := NewLimiter(LimiterConfig{Strategy: 9}); err == nil {
		t.Fatal("unknown strategy accepted")
	}
}

// TestUpdateWithoutLimitsKeepsThem: an update that leaves out limit, burst
// and window (unchanged) keeps the ones the client has.
func TestUpdateWithoutLimitsKeepsThem(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _ := NewLimiter(LimiterConfig{Strategy: Lease, Now: func() time.Time { return now }})
	l.Allow("a", 1)
	ta := (*l.tenants.Load())["a"]
	if _, err := l.Apply(update(ta, 100, 10, 100), now); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Apply(&api.RateUpdate{Ids: []uint32{ta.id}, Cap: []uint64{20}, LeaseRate: []float64{50}}, now); err != nil {
		t.Fatal(err)
	}
	st := l.TenantStats()[0]
	if st.Limit != 100 || ta.windowNanos.Load() != int64(time.Second) || ta.leaseCap.Load() != 20 || ta.mode.Load() != modeLimited {
		t.Fatalf("after an update without limits: %+v, window %d, cap %d", st, ta.windowNanos.Load(), ta.leaseCap.Load())
	}
}

func BenchmarkAllow(b *testing.B) {
	for _, st := range []Strategy{Lease, Blocklist, Local} {
		b.Run(st.String(), func(b *testing.B) {
			now := time.Now()
			l, _ := NewLimiter(LimiterConfig{Strategy: st})
			for i := range 1000 {
				l.Allow("tenant-"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1)
			}
			ta := (*l.tenants.Load())["tenant-aa"]
			u := update(ta, 1e12, 1<<62, 1e12)
			if st != Lease {
				u.Cap, u.LeaseRate = nil, nil
			}
			if st == Blocklist {
				u.BlockedForNanos = []int64{0}
			}
			if _, err := l.Apply(u, now); err != nil {
				b.Fatal(err)
			}
			h := l.Tenant("tenant-aa")
			b.Run("map", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if !l.Allow("tenant-aa", 1) {
						b.Fatal("rejected")
					}
				}
			})
			b.Run("handle", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if !h.Allow(1) {
						b.Fatal("rejected")
					}
				}
			})
		})
	}
}

// TestHandleSharesCounters: a handle decides from, and counts into, the same
// tenant state as Allow(tenant, n).
func TestHandleSharesCounters(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, _ := NewLimiter(LimiterConfig{Strategy: Lease, Now: func() time.Time { return now }})
	h := l.Tenant("a")
	if !h.Allow(5) || !l.Allow("a", 5) {
		t.Fatal("no_state must admit")
	}
	ta := (*l.tenants.Load())["a"]
	if _, err := l.Apply(update(ta, 100, 10, 0), now); err != nil {
		t.Fatal(err)
	}
	if h.Allow(1) {
		t.Fatal("handle admitted past a cap of 10 after 10 consumed")
	}
	if l.Allow("a", 1) {
		t.Fatal("Allow admitted past the cap the handle exhausted")
	}
	st := l.TenantStats()[0]
	if st.Consumed != 10 || st.Offered != 12 || st.BlockedBy["lease_exhausted"] != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// BenchmarkMapLookupBaseline is the floor Allow is measured against in the
// same run (noisy shared machines): a builtin map lookup by tenant and one
// atomic add, with nothing decided.
func BenchmarkMapLookupBaseline(b *testing.B) {
	m := map[string]*atomic.Uint64{}
	for i := range 1000 {
		m["tenant-"+string(rune('a'+i%26))+string(rune('a'+i/26))] = new(atomic.Uint64)
	}
	b.ReportAllocs()
	for b.Loop() {
		m["tenant-aa"].Add(1)
	}
}

// TestReportWindowSlices: a report that carries bucket counts carries the
// last window by age too, in WindowSlices slices of it, newest first, with
// the current slice's age: tokens attributed at a tick land in the slice of
// that tick, and slices a window old are dropped.
func TestReportWindowSlices(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	l, _ := NewLimiter(LimiterConfig{Strategy: Lease, Now: func() time.Time { return now }, ClientID: 1})
	l.Allow("a", 1)
	ta := (*l.tenants.Load())["a"]
	// A 32 s window: one slice a second.
	u := update(ta, 100, 1000, 100)
	u.WindowNanos = []int64{32 * int64(time.Second)}
	if _, err := l.Apply(u, now); err != nil {
		t.Fatal(err)
	}
	l.Tick(now) // the first token, at 0 s
	for _, step := range []struct {
		at time.Duration
		n  int
	}{{1500 * time.Millisecond, 2}, {1900 * time.Millisecond, 3}, {5200 * time.Millisecond, 4}} {
		now = start.Add(step.at)
		if !l.Allow("a", step.n) {
			t.Fatalf("%d at %v refused", step.n, step.at)
		}
		l.Tick(now)
	}
	rep := l.Report(NewReportState(), nil)
	if rep.SlicesPerWindow != WindowSlices || len(rep.WindowSliceLen) != 1 || rep.WindowSliceLen[0] != 6 || len(rep.WindowSlices) != 6 || len(rep.SliceAgeNanos) != 1 {
		t.Fatalf("%d slices per window, lengths %v, window_slices %v, slice ages %v: want %d, [6], six (to the oldest non-zero), one",
			rep.SlicesPerWindow, rep.WindowSliceLen, rep.WindowSlices, rep.SliceAgeNanos, WindowSlices)
	}
	if got := time.Duration(rep.SliceAgeNanos[0]); got != 200*time.Millisecond {
		t.Errorf("current slice age %v, want 200ms", got)
	}
	want := map[int]uint64{0: 4, 4: 5, 5: 1} // 5.2 s: slice 5; 1.5 and 1.9 s: slice 1; 0 s: slice 0
	for j, c := range rep.WindowSlices {
		if c != want[j] {
			t.Fatalf("window_slices = %v, want %v by age", rep.WindowSlices, want)
		}
	}
	// 31 s later only the 5.2 s slice is still within the last 32 slices.
	now = start.Add(36 * time.Second)
	l.Tick(now)
	rep = l.Report(NewReportState(), nil)
	var sum uint64
	for _, c := range rep.WindowSlices {
		sum += c
	}
	if sum != 4 || len(rep.WindowSlices) != 32 || rep.WindowSlices[31] != 4 {
		t.Fatalf("after 36 s: window_slices = %v, want only the 4 of 5.2 s, 31 slices old", rep.WindowSlices)
	}
	// A window later nothing is left: an idle tenant sends no slices.
	now = start.Add(40 * time.Second)
	l.Tick(now)
	if rep = l.Report(NewReportState(), nil); len(rep.WindowSlices) != 0 || rep.WindowSliceLen[0] != 0 || rep.SliceAgeNanos[0] != 0 {
		t.Fatalf("idle: lengths %v, window_slices %v, ages %v, want [0], none, [0]", rep.WindowSliceLen, rep.WindowSlices, rep.SliceAgeNanos)
	}
}
