package metering

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/metering/interval"
)

// dueScan is Due as it was before the index: every span read on every call.
// The index must answer exactly what it answers.
func dueScan(m *Module, grid interval.Grid, now int64) (work []Work, wakeAt int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, s := range m.spans {
		if s.Planned != nil {
			work = append(work, Work{Span: *s, Record: m.record(s), UsageID: s.UsageID(m.group)})
			continue
		}
		iv, d, wake := grid.Plan(s.Cursor, s.End, s.Stopped, now)
		switch d {
		case interval.Sample:
			work = append(work, Work{Span: *s, Plan: &PlanItem{Span: s.ID, Version: s.Version, Start: iv.Start, End: iv.End, Backward: iv.Backward}})
		case interval.Wait:
			if wakeAt == 0 || wake < wakeAt {
				wakeAt = wake
			}
		}
	}
	slices.SortFunc(work, func(a, b Work) int {
		return cmp.Or(cmp.Compare(a.Span.Cursor, b.Span.Cursor), cmp.Compare(a.Span.ID, b.Span.ID))
	})
	return work, wakeAt
}

func sameWork(a, b []Work) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Span.ID != y.Span.ID || x.Span.Version != y.Span.Version || (x.Plan == nil) != (y.Plan == nil) || (x.Plan != nil && *x.Plan != *y.Plan) {
			return false
		}
	}
	return true
}

// TestDueIndexMatchesScan: random starts, stops (late, early, future),
// plans, executions, restores and clocks that sometimes step back, under
// minute, hour and day grids in UTC and in a zone with daylight-saving
// changes; after every step the indexed Due answers exactly what reading
// every span answers, work and wake time alike.
func TestDueIndexMatchesScan(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		berlin = time.FixedZone("UTC+1", 3600) // no tzdata here: still an offset grid
	}
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 0xd0e))
		grid := interval.Grid{G: interval.All()[rng.IntN(3)]}
		if rng.IntN(2) == 0 {
			grid.Loc = berlin
		}
		unit := map[interval.Granularity]int64{interval.Minute: 60_000, interval.Hour: 3_600_000, interval.Day: 86_400_000}[grid.G]
		r := newReplica(t)
		// Late March: the Berlin grid crosses a daylight-saving change.
		now := int64(1_711_800_000_000)
		check := func(step int) {
			t.Helper()
			got, gotWake := r.m.Due(grid, now, 1<<30, nil)
			want, wantWake := dueScan(r.m, grid, now)
			if !sameWork(got, want) || gotWake != wantWake {
				t.Fatalf("seed %d step %d (%v, now %d): index gave %d items wake %d, scan %d items wake %d",
					seed, step, grid, now, len(got), gotWake, len(want), wantWake)
			}
		}
		for step := range 300 {
			switch op := rng.IntN(10); {
			case op < 4:
				tt := tg
				tt.Instance = fmt.Sprint(rng.IntN(12))
				ts := now - rng.Int64N(unit*2) + rng.Int64N(unit)
				if rng.IntN(2) == 0 {
					r.events(now, start(fmt.Sprint("s", step), tt, ts))
				} else {
					r.events(now, stop(fmt.Sprint("e", step), tt, ts))
				}
			case op < 7:
				work, _ := r.m.Due(grid, now, 1+rng.IntN(8), nil)
				var plans []PlanItem
				var execs []ExecItem
				for _, w := range work {
					if w.Plan != nil {
						plans = append(plans, *w.Plan)
					} else if rng.IntN(3) > 0 {
						execs = append(execs, ExecItem{Span: w.Span.ID, Version: w.Span.Version})
					}
				}
				if len(plans) > 0 {
					r.apply(EntryPlan, EncodePlan(now, plans))
				}
				if len(execs) > 0 {
					r.apply(EntryExecute, EncodeExecute(now, execs))
				}
			case op < 8 && step%25 == 0:
				r2 := newReplica(t)
				r2.restoreFrom(r.snapshot())
				r = r2
			case op == 9 && rng.IntN(4) == 0:
				now -= rng.Int64N(unit) // a caller asking about an earlier time
			default:
				now += rng.Int64N(unit)
			}
			check(step)
		}
	}
}

// BenchmarkDuePass: one sampler pass over a group with a million open spans
// of which 1,000 have work (a planned interval each), against reading every
// span as Due did before the index. The index must cost in proportion to the
// due spans:
//
//	go test -run '^$' -bench DuePass -benchtime 20x ./fsm/metering
func BenchmarkDuePass(b *testing.B) {
	const open, due = 1_000_000, 1_000
	r := newReplica(b)
	grid := interval.Grid{G: interval.Hour}
	h := int64(3_600_000)
	t0 := int64(1_700_000_000_000) / h * h
	evs := make([]Event, 0, 10_000)
	for i := range open {
		tt := tg
		tt.Instance = fmt.Sprint("i", i)
		evs = append(evs, Event{Kind: Start, Target: tt, Timestamp: t0 + h/2, Measures: []Measure{{"memory", 1}}})
		if len(evs) == cap(evs) {
			r.events(t0+h/2, evs...)
			evs = evs[:0]
		}
	}
	if len(evs) > 0 {
		r.events(t0+h/2, evs...)
	}
	// Plan one interval for `due` of them: those have work, the rest wait for
	// the next boundary.
	now := t0 + h/2 + 1
	plans := make([]PlanItem, 0, due)
	for id := uint64(1); id <= due; id++ {
		s := r.m.spans[id]
		plans = append(plans, PlanItem{Span: id, Version: s.Version, Start: s.Cursor, End: t0 + h})
	}
	r.apply(EntryPlan, EncodePlan(now, plans))
	for _, mode := range []string{"index", "scan"} {
		b.Run(mode, func(b *testing.B) {
			var n int
			r.m.Due(grid, now, 256, nil) // the index is built on first use
			for b.Loop() {
				if mode == "index" {
					w, _ := r.m.Due(grid, now, 256, nil)
					n = len(w)
				} else {
					w, _ := dueScan(r.m, grid, now)
					n = min(len(w), 256)
				}
			}
			if n != 256 {
				b.Fatalf("%s: %d items of work, want 256 of %d due", mode, n, due)
			}
		})
	}
}
