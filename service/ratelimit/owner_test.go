package ratelimit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	crl "github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

func TestBlockedForFormula(t *testing.T) {
	const limit, span = 100.0, 10.0
	cases := []struct {
		name             string
		curAge, prev, cr float64
		want             float64
	}{
		{"under the limit", 5, 500, 500, 0},                 // rate = (500×0.5+500)/10 = 75
		{"current bucket alone over budget", 4, 0, 1100, 6}, // until the end of the bucket
		{"decay of the previous bucket", 5, 1600, 600, 2.5}, // rate 140, excess 40, decay 160/s... min(5, 40/160=0.25)
		{"late in the bucket", 9, 2000, 900, 0.05},          // rate 110, excess 10, decay 200/s
	}
	cases[2].want = math.Min(5, ((1600*0.5+600)/10-limit)/(1600/10))
	for _, c := range cases {
		got := blockedFor(limit, span, c.curAge, c.prev, c.cr)
		if math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: blockedFor = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAbsorbRejectsBadInput(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	o := mustNew(t, Config{MaxTenantsPerStream: 10}, 64, 4, func(string) (float64, int64) { return 1, 0 })
	good := func() *api.RateReport {
		return &api.RateReport{ClientId: 7, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, NewIds: []uint32{1}, NewNames: []string{"a"},
			Ids: []uint32{1}, ConsumedTotal: []uint64{1}, OfferedTotal: []uint64{1}, BucketStartUnixNanos: []int64{0},
			BucketConsumed: []uint64{1}, PrevBucketConsumed: []uint64{0}}
	}
	cases := []struct {
		name string
		mod  func(r *api.RateReport)
		want error
		msg  string
	}{
		{"no client id", func(r *api.RateReport) { r.ClientId = 0 }, ErrInvalid, "client_id"},
		{"unknown strategy", func(r *api.RateReport) { r.Strategy = 99 }, ErrInvalid, "strategy"},
		{"ragged arrays", func(r *api.RateReport) { r.OfferedTotal = nil }, ErrInvalid, "parallel arrays"},
		{"names and ids differ", func(r *api.RateReport) { r.NewNames = nil }, ErrInvalid, "new names"},
		{"bad tenant", func(r *api.RateReport) { r.NewNames = []string{"a/b"} }, ErrInvalid, "new_names[0]"},
		{"id never introduced", func(r *api.RateReport) { r.Ids = []uint32{2} }, ErrInvalid, "never introduced"},
		{"id zero", func(r *api.RateReport) { r.NewIds = []uint32{0}; r.Ids = []uint32{0} }, ErrInvalid, "reserved"},
		{"too many tenants", func(r *api.RateReport) { r.NewIds = []uint32{11}; r.Ids = []uint32{11} }, ErrTooMany, "at most 10"},
		{"ragged bucket ages", func(r *api.RateReport) { r.BucketAgeNanos = []int64{1, 2} }, ErrInvalid, "1 ids"},
		{"negative bucket age", func(r *api.RateReport) { r.BucketAgeNanos = []int64{-1} }, ErrInvalid, "bucket_age_nanos[0]"},
		{"ragged lease shares", func(r *api.RateReport) { r.LeaseShare = []float64{0.5, 0.5} }, ErrInvalid, "lease_share (2)"},
		{"lease share without buckets", func(r *api.RateReport) {
			r.BucketStartUnixNanos, r.BucketConsumed, r.PrevBucketConsumed, r.LeaseShare = nil, nil, nil, []float64{0.5}
		}, ErrInvalid, "with the bucket counts"},
		{"lease share over 1", func(r *api.RateReport) { r.LeaseShare = []float64{1.5} }, ErrInvalid, "lease_share[0] = 1.5"},
		{"lease share NaN", func(r *api.RateReport) { r.LeaseShare = []float64{math.NaN()} }, ErrInvalid, "lease_share[0] = NaN"},
		{"window slices without lengths", func(r *api.RateReport) {
			r.SlicesPerWindow, r.WindowSlices, r.SliceAgeNanos = 32, []uint64{1}, []int64{0}
		}, ErrInvalid, "window_slice_len (0)"},
		{"window slices without buckets", func(r *api.RateReport) {
			r.BucketStartUnixNanos, r.BucketConsumed, r.PrevBucketConsumed = nil, nil, nil
			r.SlicesPerWindow, r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = 32, []uint32{1}, []uint64{1}, []int64{0}
		}, ErrInvalid, "with the bucket counts"},
		{"no slices per window", func(r *api.RateReport) {
			r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = []uint32{1}, []uint64{1}, []int64{0}
		}, ErrInvalid, "slices_per_window = 0"},
		{"too many slices per window", func(r *api.RateReport) {
			r.SlicesPerWindow, r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = 1025, []uint32{1}, []uint64{1}, []int64{0}
		}, ErrInvalid, "want 1 to 1024"},
		{"slice length over the window", func(r *api.RateReport) {
			r.SlicesPerWindow, r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = 2, []uint32{3}, []uint64{1, 1, 1}, []int64{0}
		}, ErrInvalid, "window_slice_len[0] = 3"},
		{"slice lengths do not add up", func(r *api.RateReport) {
			r.SlicesPerWindow, r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = 32, []uint32{2}, []uint64{1, 1, 1}, []int64{0}
		}, ErrInvalid, "adds up to 2"},
		{"negative slice age", func(r *api.RateReport) {
			r.SlicesPerWindow, r.WindowSliceLen, r.WindowSlices, r.SliceAgeNanos = 32, []uint32{1}, []uint64{1}, []int64{-1}
		}, ErrInvalid, "slice_age_nanos[0]"},
	}
	for _, c := range cases {
		s := o.NewSession()
		r := good()
		c.mod(r)
		err := s.Absorb(r, now)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", c.name, err, c.want, c.msg)
		}
		if len(s.loc) != 0 || s.started {
			t.Errorf("%s: a rejected report changed the session", c.name)
		}
		s.Close()
	}
	s := o.NewSession()
	if err := s.Absorb(good(), now); err != nil {
		t.Fatalf("good report: %v", err)
	}
	r := good()
	r.NewNames = []string{"b"}
	if err := s.Absorb(r, now); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "renamed") {
		t.Errorf("renaming a tenant id: err = %v", err)
	}
}

// TestNewOwnerRebuildsWindow: the clients' first reports to a new owner carry
// their own bucket counts, so the new owner's window (and the blocklist it
// computes) is whole again after one report round, not reset to zero.
func TestNewOwnerRebuildsWindow(t *testing.T) {
	now := time.Unix(1_800_000_000, 300_000_000) // 0.3 s into a 1 s bucket
	clock := func() time.Time { return now }
	limits := func(string) (float64, int64) { return 1000, 0 } // window 1 s, budget 1000
	all := func(int) bool { return true }
	none := func(int) (string, string) { return "", "" }

	var lims []*crl.Limiter
	for i := range 3 {
		l, _ := crl.NewLimiter(crl.LimiterConfig{Strategy: crl.Blocklist, Now: clock, ClientID: uint64(i + 1)})
		lims = append(lims, l)
	}
	// Each client admits 500 tokens before any update: 1500 in the current
	// bucket, 1.5× the limit.
	for _, l := range lims {
		for range 50 {
			l.Allow("t", 10)
		}
		l.Tick(now)
	}
	run := func(o *Owner) *Owner {
		var sess []*Session
		for _, l := range lims {
			s := o.NewSession()
			if err := s.Absorb(l.Report(crl.NewReportState(), nil), now); err != nil {
				t.Fatal(err)
			}
			sess = append(sess, s)
		}
		o.Tick(now, all, none)
		for i, s := range sess {
			if _, err := lims[i].Apply(s.Take(), now); err != nil {
				t.Fatal(err)
			}
		}
		return o
	}
	first := run(mustNew(t, Config{}, 64, 4, limits))
	if got := first.lookup("t").cur; got != 1500 {
		t.Fatalf("first owner's current bucket = %v, want 1500", got)
	}
	// Failover: a new owner with empty memory hears the same clients once.
	second := run(mustNew(t, Config{}, 64, 4, limits))
	ts := second.lookup("t")
	if ts.cur != 1500 {
		t.Fatalf("new owner's current bucket = %v, want 1500 (rebuilt from client counts)", ts.cur)
	}
	if ts.blockedTil <= now.UnixNano() {
		t.Fatalf("new owner does not block a tenant at 1.5× its limit")
	}
	for i, l := range lims {
		if l.Allow("t", 10) {
			t.Errorf("client %d admits after the new owner's first update", i)
		}
	}
}

// TestReconnectDoesNotDoubleCount: a client that opens a new stream to the
// same owner (while the old one lingers, or after it closed) continues from
// its last folded cumulative count; its bucket counts are not added again.
func TestReconnectDoesNotDoubleCount(t *testing.T) {
	now := time.Unix(1_800_000_000, 100_000_000)
	clock := func() time.Time { return now }
	limits := func(string) (float64, int64) { return 10_000, 0 } // window 1 s
	all := func(int) bool { return true }
	none := func(int) (string, string) { return "", "" }
	l, _ := crl.NewLimiter(crl.LimiterConfig{Strategy: crl.Lease, Now: clock, ClientID: 42})
	o := mustNew(t, Config{}, 64, 4, limits)
	round := func(s *Session, st *crl.ReportState, admit int) {
		t.Helper()
		for range admit / 10 {
			l.Allow("t", 10)
		}
		l.Tick(now)
		if err := s.Absorb(l.Report(st, nil), now); err != nil {
			t.Fatal(err)
		}
		o.Tick(now, all, none)
		if u := s.Take(); u != nil {
			if _, err := l.Apply(u, now); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(100 * time.Millisecond)
	}
	s1, st1 := o.NewSession(), crl.NewReportState()
	round(s1, st1, 500)
	if got := o.lookup("t").cur; got != 500 {
		t.Fatalf("after the first stream: window %v, want 500", got)
	}
	// New stream while the old one is still open (the server has not noticed
	// the broken connection yet).
	s2, st2 := o.NewSession(), crl.NewReportState()
	round(s2, st2, 100)
	if got := o.lookup("t").cur; got != 600 {
		t.Fatalf("after reconnecting with the old stream open: window %v, want 600 (not 1100: counted twice)", got)
	}
	// The old stream reports again (late): it no longer counts.
	if err := s1.Absorb(l.Report(st1, nil), now); err != nil {
		t.Fatal(err)
	}
	o.Tick(now, all, none)
	if got := o.lookup("t").cur; got != 600 {
		t.Fatalf("a superseded stream's report changed the window: %v, want 600", got)
	}
	s1.Close()
	s2.Close()
	// A third stream after both closed: the carried state continues.
	s3, st3 := o.NewSession(), crl.NewReportState()
	round(s3, st3, 100)
	if got := o.lookup("t").cur; got != 700 {
		t.Fatalf("after reconnecting to a closed stream's owner: window %v, want 700", got)
	}
	// A different client is new to the owner: its bucket counts seed.
	l2, _ := crl.NewLimiter(crl.LimiterConfig{Strategy: crl.Lease, Now: clock, ClientID: 43})
	for range 20 {
		l2.Allow("t", 10)
	}
	l2.Tick(now)
	s4 := o.NewSession()
	if err := s4.Absorb(l2.Report(crl.NewReportState(), nil), now); err != nil {
		t.Fatal(err)
	}
	o.Tick(now, all, none)
	if got := o.lookup("t").cur; got != 900 {
		t.Fatalf("a new client's counts: window %v, want 900", got)
	}
	s3.Close()
	s4.Close()
	// Forgotten after ForgetAfter: the owner drops the carried state.
	now = now.Add(o.cfg.ForgetAfter + time.Second)
	o.Tick(now, all, none)
	if len(o.clients) != 0 {
		t.Fatalf("%d client records kept after ForgetAfter", len(o.clients))
	}
}

// TestSeedByAge: a client's bucket counts placed on the owner's clock by
// their age. Window 1 s, the owner's current bucket began at 10.0 s and it is
// 10.3 s; the client's current bucket (600 tokens) had run 0.6 s when the
// report arrived at 10.3 s, so it spans [9.7, 10.3]: half in the owner's
// current bucket, half in its previous one; the client's previous bucket
// (1,000) spans [8.7, 9.7], 0.7 of it in the owner's previous bucket. In the
// sliding window [9.3, 10.3] the client admitted 600 + 0.4 × 1,000. A report
// absorbed long ago counts for nothing.
func TestSeedByAge(t *testing.T) {
	const s = int64(time.Second)
	ts := &tenantState{window: s, curStart: 10 * s}
	now := 10*s + 3*s/10
	e := &entry{bucketCur: 600, bucketP: 1000, bucketAge: 6 * s / 10, absorbedAt: now, hasAge: true}
	e.seedByAge(ts, now)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	if !near(ts.cur, 300) || !near(ts.prev, 1000) {
		t.Errorf("seeded cur %.3f, prev %.3f; want 300, 1000", ts.cur, ts.prev)
	}
	if got := e.windowCount(ts.curStart, s, now); !near(got, 1000) {
		t.Errorf("window count %.3f, want 1000", got)
	}
	old := &entry{bucketCur: 600, bucketP: 1000, bucketAge: 6 * s / 10, absorbedAt: 5 * s, hasAge: true}
	ts2 := &tenantState{window: s, curStart: 10 * s}
	old.seedByAge(ts2, now)
	if ts2.cur != 0 || ts2.prev != 0 || old.windowCount(ts2.curStart, s, now) != 0 {
		t.Errorf("a report absorbed 5 s ago seeded cur %.1f, prev %.1f, window %.1f; want 0", ts2.cur, ts2.prev, old.windowCount(ts2.curStart, s, now))
	}
}
