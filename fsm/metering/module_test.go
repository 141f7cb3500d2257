package metering

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/metering/interval"
)

const slack = 62 * 24 * 3_600_000

type replica struct {
	t   testing.TB
	f   *fsm.FSM
	m   *Module
	idx uint64
}

func newReplica(t testing.TB) *replica {
	t.Helper()
	m := New(1)
	f, err := fsm.New(fsm.Config{Partitions: 64, Groups: 4, Shards: 16, Group: 1, Modules: []fsm.Module{m}})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{t: t, f: f, m: m}
}

func (r *replica) apply(typ byte, payload []byte) any {
	r.t.Helper()
	b, err := fsm.AppendModuleEntry(nil, typ, 1, payload)
	if err != nil {
		r.t.Fatal(err)
	}
	r.idx++
	res := r.f.Apply(&raft.Log{Index: r.idx, Term: 1, Type: raft.LogCommand, Data: b})
	if err, ok := res.(error); ok {
		r.t.Fatalf("apply type %d: %v", typ, err)
	}
	return res
}

func (r *replica) events(now int64, evs ...Event) []Result {
	r.t.Helper()
	return r.apply(EntryEvents, EncodeEvents(now, slack, evs)).([]Result)
}

type memSink struct {
	bytes.Buffer
}

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

func (r *replica) snapshot() []byte {
	r.t.Helper()
	s, err := r.f.Snapshot()
	if err != nil {
		r.t.Fatal(err)
	}
	defer s.Release()
	var sink memSink
	if err := s.Persist(&sink); err != nil {
		r.t.Fatal(err)
	}
	return sink.Bytes()
}

func (r *replica) restoreFrom(snap []byte) {
	r.t.Helper()
	if err := r.f.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		r.t.Fatal(err)
	}
	r.idx = r.f.AppliedIndex()
}

var tg = Target{"org", "space", "consumer", "postgres", "large", "inst-1"}

func start(id string, t Target, ts int64) Event {
	return Event{Kind: Start, ID: id, Target: t, Timestamp: ts, Measures: []Measure{{"memory", 512}}}
}

func stop(id string, t Target, ts int64) Event {
	return Event{Kind: Stop, ID: id, Target: t, Timestamp: ts}
}

// TestEventRules covers every outcome of the receiver's rules.
func TestEventRules(t *testing.T) {
	r := newReplica(t)
	now := int64(1_700_000_000_000)
	other := tg
	other.Instance = "inst-2"
	steps := []struct {
		name string
		ev   Event
		now  int64
		want Code
	}{
		{"start", start("s1", tg, now-1000), now, Created},
		{"exact duplicate start", start("s1", tg, now-1000), now, Duplicate},
		{"id reused for another start", start("s1", other, now-1000), now, Conflict},
		{"second start on an active target", start("s2", tg, now), now, Conflict},
		{"start without id on an active target", start("", tg, now), now, Conflict},
		{"stop of a target without span", stop("x1", other, now), now, Unprocessable},
		{"stop before start", stop("e1", tg, now-2000), now, Unprocessable},
		{"start outside the slack (past)", start("s3", other, now-slack-1), now, Unprocessable},
		{"start outside the slack (future)", start("s3", other, now+slack+1), now, Unprocessable},
		{"start at the edge of the slack", start("s3", other, now-slack), now, Created},
		{"stop", stop("e1", tg, now+5000), now, Created},
		{"exact duplicate stop", stop("e1", tg, now+5000), now, Duplicate},
		{"stop id reused with another timestamp", stop("e1", tg, now+6000), now, Conflict},
		{"second stop", stop("e2", tg, now+6000), now, Unprocessable},
		{"restart after stop (update = stop+start)", start("s4", tg, now+5000), now, Created},
	}
	for _, s := range steps {
		res := r.events(s.now, s.ev)
		if len(res) != 1 || res[0].Code != s.want {
			t.Fatalf("%s: %+v, want code %d", s.name, res, s.want)
		}
		if s.want >= Conflict && res[0].Reason == "" {
			t.Fatalf("%s: refusal without a reason", s.name)
		}
	}
	if st := r.m.Stats(interval.Grid{G: interval.Hour}, now); st.SpansOpen != 2 || st.Spans != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// A retried start after its span was fully sampled and cleaned up must not
// bill twice: the dedup id outlives the span until the slack window has
// passed, and then the retry is outside the slack window.
func TestRetriedStartAfterCleanup(t *testing.T) {
	r := newReplica(t)
	now := int64(1_700_000_000_000)
	r.events(now, start("s1", tg, now), stop("e1", tg, now)) // zero length: complete at once
	if n := len(r.m.Spans()); n != 0 {
		t.Fatalf("%d spans left after a zero-length span", n)
	}
	for _, later := range []int64{now + 1, now + slack/2, now + slack} {
		r.apply(EntryTick, EncodeTick(later, 0))
		if res := r.events(later, start("s1", tg, now)); res[0].Code != Duplicate {
			t.Fatalf("retry at +%d ms: %+v", later-now, res[0])
		}
	}
	r.apply(EntryTick, EncodeTick(now+slack+1, 0))
	if res := r.events(now+slack+1, start("s1", tg, now)); res[0].Code != Unprocessable {
		t.Fatalf("retry after the slack window: %+v", res[0])
	}
	if n := len(r.m.Spans()); n != 0 {
		t.Fatalf("a retry created a span")
	}
}

// runSampler runs the planner against the module until nothing is due at now,
// proposing plans and executions like the sampler; crash makes it drop an
// execution after a plan (a failover: the next pass finds the plan).
func runSampler(r *replica, grid interval.Grid, now int64, crash func() bool) {
	for range 100_000 {
		work, _ := r.m.Due(grid, now, 64, nil)
		if len(work) == 0 {
			return
		}
		var plans []PlanItem
		var execs []ExecItem
		for _, w := range work {
			if w.Plan != nil {
				plans = append(plans, *w.Plan)
			} else if crash == nil || !crash() {
				execs = append(execs, ExecItem{Span: w.Span.ID, Version: w.Span.Version})
			}
		}
		if len(plans) > 0 {
			r.apply(EntryPlan, EncodePlan(now, plans))
		}
		if len(execs) > 0 {
			r.apply(EntryExecute, EncodeExecute(now, execs))
		}
	}
	r.t.Fatal("sampler did not become idle")
}

func TestPlanExecuteLedger(t *testing.T) {
	r := newReplica(t)
	grid := interval.Grid{G: interval.Hour}
	h := int64(3_600_000)
	t0 := int64(1_700_000_000_000) / h * h // an hour boundary
	r.events(t0, start("s", tg, t0+h/2))
	runSampler(r, grid, t0+3*h+1, nil)          // [t0+h/2, t0+h), [t0+h, t0+2h), [t0+2h, t0+3h)
	r.events(t0+3*h+1, stop("e", tg, t0+h+h/4)) // late stop
	runSampler(r, grid, t0+3*h+2, nil)
	recs := r.m.Query(Filter{Target: Target{Org: "org"}})
	var durs []float64
	seen := map[string]bool{}
	for _, rc := range recs {
		if seen[rc.UsageID] {
			t.Fatalf("usage id %s twice", rc.UsageID)
		}
		seen[rc.UsageID] = true
		durs = append(durs, rc.Measures[len(rc.Measures)-1].Quantity)
		if rc.Measures[0] != (Measure{"memory", 512}) || rc.Measures[1].Name != "duration" {
			t.Fatalf("measures %+v", rc.Measures)
		}
	}
	// Sorted by timestamp: window 0: +h/2; window 1: +h then -3h/4; window 2: +h then -h.
	want := []float64{float64(h / 2), float64(h), float64(-3 * h / 4), float64(h), float64(-h)}
	if fmt.Sprint(sortedByWindow(recs, grid)) != fmt.Sprint(want) {
		t.Fatalf("durations %v, want %v (records %+v)", sortedByWindow(recs, grid), want, recs)
	}
	if len(r.m.Spans()) != 0 {
		t.Fatalf("span not cleaned up: %+v", r.m.Spans())
	}
	if got := r.m.Query(Filter{Target: tg, From: t0 + h, To: t0 + 2*h}); len(got) != 2 {
		t.Fatalf("time-range query: %+v", got)
	}
	_ = durs
}

func sortedByWindow(recs []Record, grid interval.Grid) []float64 {
	// Records sorted by timestamp already; within a window, positives come
	// before the later negatives because midpoints of backward intervals of
	// a late stop lie after the stop.
	var out []float64
	for _, rc := range recs {
		out = append(out, rc.Measures[len(rc.Measures)-1].Quantity)
	}
	return out
}

// Stale plans and executions (an old leader's, after a newer one acted)
// are ignored.
func TestStalePlanAndExecuteIgnored(t *testing.T) {
	r := newReplica(t)
	grid := interval.Grid{G: interval.Minute}
	t0 := int64(1_700_000_040_000)
	r.events(t0, start("s", tg, t0))
	work, _ := r.m.Due(grid, t0+120_000, 10, nil)
	if len(work) != 1 || work[0].Plan == nil {
		t.Fatalf("work %+v", work)
	}
	p := *work[0].Plan
	if n := r.apply(EntryPlan, EncodePlan(t0, []PlanItem{p})); n != 1 {
		t.Fatalf("plan applied %v", n)
	}
	if n := r.apply(EntryPlan, EncodePlan(t0, []PlanItem{p})); n != 0 {
		t.Fatalf("second plan at the same version applied %v", n)
	}
	work, _ = r.m.Due(grid, t0+120_000, 10, nil)
	id := work[0].UsageID
	ex := ExecItem{Span: work[0].Span.ID, Version: work[0].Span.Version}
	if n := r.apply(EntryExecute, EncodeExecute(t0, []ExecItem{ex, ex})); n != 1 {
		t.Fatalf("execute applied %v", n)
	}
	if recs := r.m.Query(Filter{}); len(recs) != 1 || recs[0].UsageID != id {
		t.Fatalf("ledger %+v, want one record %s", recs, id)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	r := newReplica(t)
	grid := interval.Grid{G: interval.Minute}
	now := int64(1_700_000_000_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		tt := tg
		tt.Instance = fmt.Sprint(rng.IntN(30))
		r.events(now, start(fmt.Sprint("s", i), tt, now-rng.Int64N(600_000)), stop(fmt.Sprint("e", i), tt, now-rng.Int64N(300_000)))
		now += 10_000
		if i%7 == 0 {
			runSampler(r, grid, now, func() bool { return rng.IntN(3) == 0 })
		}
	}
	r.apply(EntrySeries, EncodeSeries(now/60_000, []TenantActive{{"t1", 10}, {"t2", 20}}))
	r.apply(EntryExecute, EncodeExecute(now, nil))
	work, _ := r.m.Due(grid, now, 1000, nil)
	var execs []ExecItem
	for _, w := range work {
		if w.Plan == nil {
			execs = append(execs, ExecItem{Span: w.Span.ID, Version: w.Span.Version, DeadCode: 400, Reason: "bad"})
		}
	}
	r.apply(EntryExecute, EncodeExecute(now, execs))
	snap := r.snapshot()
	r2 := newReplica(t)
	r2.restoreFrom(snap)
	if !bytes.Equal(r2.snapshot(), snap) {
		t.Fatal("snapshot of the restored replica differs")
	}
	if a, b := r.m.Stats(grid, now), r2.m.Stats(grid, now); a.Spans != b.Spans || a.Records != b.Records || a.DeadLetters != b.DeadLetters || a.Records == 0 || (len(execs) > 0 && a.DeadLetters == 0) {
		t.Fatalf("stats %+v vs restored %+v", a, b)
	}
	if got := r2.m.SeriesSamples("t2", 0, 0, false); len(got) != 1 || got[0].Active != 20 {
		t.Fatalf("series samples %+v", got)
	}
	// Both continue identically.
	r.events(now, start("z", tg, now))
	r2.events(now, start("z", tg, now))
	runSampler(r, grid, now+600_000, nil)
	runSampler(r2, grid, now+600_000, nil)
	if !bytes.Equal(r.snapshot(), r2.snapshot()) {
		t.Fatal("replicas diverged after restore")
	}
	// A restore from a snapshot without the section resets the module.
	r3 := newReplica(t)
	r2.restoreFrom(r3.snapshot())
	if st := r2.m.Stats(grid, now); st.Spans != 0 || st.Records != 0 {
		t.Fatalf("not reset: %+v", st)
	}
}

// TestConservationThroughRaft is the conservation property on the module:
// random starts and stops (late, duplicate, out of order, refused), random
// crashes between the sink call and the execution entry, and failovers (a new
// replica restored from a snapshot takes over); once idle, per target and
// window, durations sum to the overlap of [start, end), and usage ids are
// unique at a sink that dedups by id.
func TestConservationThroughRaft(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 99))
		grid := interval.Grid{G: interval.All()[rng.IntN(3)]}
		unit := map[interval.Granularity]int64{interval.Minute: 60_000, interval.Hour: 3_600_000, interval.Day: 86_400_000}[grid.G]
		r := newReplica(t)
		now := int64(1_700_000_000_000)
		truth := map[string][][2]int64{}
		openAt := map[string]int64{}
		sinkSeen := map[string]Record{}
		crash := func() bool { return rng.IntN(4) == 0 }
		deliver := func() {
			// The "HTTP sink": everything planned is posted before it executes.
			work, _ := r.m.Due(grid, now, 1<<20, nil)
			for _, w := range work {
				if w.Plan == nil {
					if prev, ok := sinkSeen[w.UsageID]; ok && prev.Start != w.Record.Start {
						t.Fatalf("seed %d: usage id %s reused for another interval", seed, w.UsageID)
					}
					sinkSeen[w.UsageID] = w.Record
				}
			}
		}
		for i := range 150 {
			now += rng.Int64N(unit)
			tt := tg
			tt.Instance = fmt.Sprint(rng.IntN(4))
			k := tt.key()
			var ev Event
			if rng.IntN(2) == 0 {
				ev = start(fmt.Sprint("s", i), tt, now-rng.Int64N(unit*2))
			} else {
				ev = stop(fmt.Sprint("e", i), tt, now-rng.Int64N(unit*3))
			}
			res := r.events(now, ev)
			if rng.IntN(5) == 0 {
				if dup := r.events(now, ev); dup[0].Code != Duplicate && res[0].Code == Created && ev.ID != "" {
					t.Fatalf("seed %d: retry of an accepted event got %+v", seed, dup[0])
				}
			}
			if res[0].Code == Created {
				if ev.Kind == Start {
					openAt[k] = ev.Timestamp
				} else {
					truth[k] = append(truth[k], [2]int64{openAt[k], ev.Timestamp})
					delete(openAt, k)
				}
			}
			if rng.IntN(3) == 0 {
				deliver()
				runSampler(r, grid, now, crash)
			}
			if rng.IntN(15) == 0 { // failover: a new replica from a snapshot
				r2 := newReplica(t)
				r2.restoreFrom(r.snapshot())
				r = r2
			}
		}
		for k, s := range openAt {
			res := r.events(now, Event{Kind: Stop, ID: "final" + k, Target: targetOfKey(r, k), Timestamp: now})
			if res[0].Code != Created {
				t.Fatalf("final stop: %+v", res[0])
			}
			truth[k] = append(truth[k], [2]int64{s, now})
		}
		now += 3 * unit
		deliver()
		runSampler(r, grid, now, nil)
		if n := len(r.m.Spans()); n != 0 {
			t.Fatalf("seed %d: %d spans left", seed, n)
		}
		ledger := r.m.Query(Filter{})
		got := map[string]int64{}
		ids := map[string]bool{}
		for _, rc := range ledger {
			if ids[rc.UsageID] {
				t.Fatalf("seed %d: usage id %s twice in the ledger", seed, rc.UsageID)
			}
			ids[rc.UsageID] = true
			d := int64(rc.Measures[len(rc.Measures)-1].Quantity)
			if d == 0 {
				t.Fatalf("zero duration")
			}
			got[fmt.Sprint(rc.Target.key(), grid.Floor(rc.Timestamp))] += d
		}
		for id, rc := range sinkSeen {
			if !ids[id] || len(r.m.Query(Filter{Target: rc.Target})) == 0 {
				t.Fatalf("seed %d: sink record %s not in the ledger", seed, id)
			}
		}
		want := map[string]int64{}
		for k, ps := range truth {
			for _, p := range ps {
				for w := grid.Floor(p[0]); w < p[1]; w = grid.Next(w) {
					if o := min(p[1], grid.Next(w)) - max(p[0], w); o > 0 {
						want[fmt.Sprint(k, w)] += o
					}
				}
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("seed %d: %q: sum %d, overlap %d", seed, k, got[k], v)
			}
		}
		for k, v := range got {
			if want[k] != v {
				t.Fatalf("seed %d: %q: sum %d, no usage", seed, k, v)
			}
		}
	}
}

func targetOfKey(r *replica, k string) Target {
	for _, s := range r.m.Spans() {
		if s.Target.key() == k {
			return s.Target
		}
	}
	r.t.Fatalf("no span for %q", k)
	return Target{}
}

// TestSeriesWindow checks the window read against SeriesSamples: the samples
// in [from, to) of every tenant, led by the count in force at from.
func TestSeriesWindow(t *testing.T) {
	r := newReplica(t)
	r.apply(EntrySeries, EncodeSeries(10, []TenantActive{{"a", 1}, {"b", 5}}))
	r.apply(EntrySeries, EncodeSeries(20, []TenantActive{{"a", 2}}))
	r.apply(EntrySeries, EncodeSeries(30, []TenantActive{{"a", 3}, {"c", 7}}))
	for _, tc := range []struct {
		from, to int64
		want     string
	}{
		{0, 0, "map[a:[{10 1} {20 2} {30 3}] b:[{10 5}] c:[{30 7}]]"},
		{20, 30, "map[a:[{20 2}] b:[{10 5}]]"},
		{21, 31, "map[a:[{20 2} {30 3}] b:[{10 5}] c:[{30 7}]]"},
		{5, 10, "map[]"},
		{40, 0, "map[a:[{30 3}] b:[{10 5}] c:[{30 7}]]"},
		{30, 20, "map[]"},
	} {
		if got := fmt.Sprint(r.m.SeriesWindow(tc.from, tc.to)); got != tc.want {
			t.Errorf("SeriesWindow(%d, %d) = %s, want %s", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestSeriesSamplesOfOneTenant: with the prior sample, one tenant's read is
// its SeriesWindow row; without, exactly the samples in [from, to).
func TestSeriesSamplesOfOneTenant(t *testing.T) {
	r := newReplica(t)
	r.apply(EntrySeries, EncodeSeries(10, []TenantActive{{"a", 1}, {"b", 5}}))
	r.apply(EntrySeries, EncodeSeries(20, []TenantActive{{"a", 2}}))
	r.apply(EntrySeries, EncodeSeries(30, []TenantActive{{"a", 3}, {"c", 7}}))
	for from := int64(0); from <= 42; from++ {
		for _, to := range []int64{0, from - 1, from, from + 1, from + 10, 100} {
			w := r.m.SeriesWindow(from, to)
			for _, tn := range []string{"a", "b", "c", "none"} {
				if got, want := fmt.Sprint(r.m.SeriesSamples(tn, from, to, true)), fmt.Sprint(w[tn]); got != want {
					t.Fatalf("SeriesSamples(%s, %d, %d, prior) = %s, want %s", tn, from, to, got, want)
				}
				var plain []Sample
				for _, x := range w[tn] {
					if x.Minute >= from {
						plain = append(plain, x)
					}
				}
				if got, want := fmt.Sprint(r.m.SeriesSamples(tn, from, to, false)), fmt.Sprint(plain); got != want {
					t.Fatalf("SeriesSamples(%s, %d, %d) = %s, want %s", tn, from, to, got, want)
				}
			}
		}
	}
}
