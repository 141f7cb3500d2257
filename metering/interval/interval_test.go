package interval

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// pt is a point on a grid: boundary k plus num/den of the window after it.
type pt struct {
	k        int
	num, den int64
	off      int64 // extra milliseconds
}

func at(k int) pt { return pt{k, 0, 1, 0} }

// in is a point strictly inside window k.
func in(k int, num, den int64) pt { return pt{k, num, den, 0} }

// msAt is boundary k plus off milliseconds.
func msAt(k int, off int64) pt { return pt{k, 0, 1, off} }

// boundaries returns B_-3 … B_6 around an origin: index i+3 is B_i.
func boundaries(gr Grid, origin int64) []int64 {
	b := []int64{gr.Floor(origin)}
	for range 6 {
		b = append(b, gr.Next(b[len(b)-1]))
	}
	for range 3 {
		b = append([]int64{gr.Prev(b[0])}, b...)
	}
	return b
}

func (p pt) ms(bs []int64) int64 {
	lo, hi := bs[p.k+3], bs[p.k+4]
	return lo + (hi-lo)*p.num/p.den + p.off
}

// TestPlanTable covers every case of the interval selection (§5.2,
// §6.5) for every granularity: forward and backward, on and around
// boundaries, whole windows apart, zero length, stops in the future.
func TestPlanTable(t *testing.T) {
	type want struct {
		d        Decision
		from, to pt // interval Start, End (ignored unless Sample)
		back     bool
		wake     pt // for Wait
	}
	cases := []struct {
		name    string
		cursor  pt
		end     pt
		stopped bool
		now     pt
		want    want
	}{
		// Open spans: only elapsed windows are sampled.
		{"open, window not elapsed", in(0, 1, 4), pt{}, false, in(0, 3, 4), want{d: Wait, wake: at(1)}},
		{"open, cursor on boundary, window not elapsed", at(0), pt{}, false, in(0, 1, 2), want{d: Wait, wake: at(1)}},
		{"open, now exactly on the next boundary", in(0, 1, 4), pt{}, false, at(1), want{d: Sample, from: in(0, 1, 4), to: at(1)}},
		{"open, window elapsed", in(0, 1, 4), pt{}, false, in(1, 1, 2), want{d: Sample, from: in(0, 1, 4), to: at(1)}},
		{"open, whole windows apart: one window at a time", in(0, 1, 4), pt{}, false, in(3, 1, 2), want{d: Sample, from: in(0, 1, 4), to: at(1)}},
		{"open, from a boundary, whole window", at(1), pt{}, false, in(3, 1, 2), want{d: Sample, from: at(1), to: at(2)}},
		{"open, caught up to the floor of now", at(3), pt{}, false, in(3, 1, 2), want{d: Wait, wake: at(4)}},
		{"open, start in the future", in(4, 1, 2), pt{}, false, in(1, 0, 1), want{d: Wait, wake: at(5)}},
		// Stopped, end reached: forward to the end.
		{"stopped in the same window", in(0, 1, 4), in(0, 3, 4), true, in(0, 7, 8), want{d: Sample, from: in(0, 1, 4), to: in(0, 3, 4)}},
		{"stopped exactly at now", in(0, 1, 4), in(0, 3, 4), true, in(0, 3, 4), want{d: Sample, from: in(0, 1, 4), to: in(0, 3, 4)}},
		{"stopped in a later window", in(0, 1, 4), in(2, 1, 2), true, in(5, 0, 1), want{d: Sample, from: in(0, 1, 4), to: at(1)}},
		{"stopped, last partial window", at(2), in(2, 1, 2), true, in(5, 0, 1), want{d: Sample, from: at(2), to: in(2, 1, 2)}},
		{"stopped on a boundary", at(1), at(2), true, in(5, 0, 1), want{d: Sample, from: at(1), to: at(2)}},
		{"stopped just after a boundary", at(1), msAt(2, 1), true, in(5, 0, 1), want{d: Sample, from: at(1), to: at(2)}},
		{"stopped just before a boundary", at(1), msAt(2, -1), true, in(5, 0, 1), want{d: Sample, from: at(1), to: msAt(2, -1)}},
		// Stopped in the future: behave as open until the end is reached.
		{"stop in the future, window elapsed", in(0, 1, 4), in(3, 1, 2), true, in(1, 1, 2), want{d: Sample, from: in(0, 1, 4), to: at(1)}},
		{"stop in the future, caught up", at(1), in(1, 1, 2), true, in(1, 1, 4), want{d: Wait, wake: in(1, 1, 2)}},
		{"stop in the future, later window", at(1), in(3, 1, 2), true, in(1, 1, 4), want{d: Wait, wake: at(2)}},
		// Zero length: complete, nothing emitted.
		{"start equals stop", in(0, 1, 3), in(0, 1, 3), true, in(4, 0, 1), want{d: Complete}},
		{"fully sampled on a boundary", at(2), at(2), true, in(4, 0, 1), want{d: Complete}},
		// Late stops: backward, boundary by boundary.
		{"late stop in the same window", at(1), in(0, 1, 2), true, in(1, 1, 2), want{d: Sample, from: in(0, 1, 2), to: at(1), back: true}},
		{"late stop, cursor inside a window", in(1, 1, 2), in(1, 1, 4), true, in(2, 1, 2), want{d: Sample, from: in(1, 1, 4), to: in(1, 1, 2), back: true}},
		{"late stop whole windows back: first step", at(3), in(0, 1, 2), true, in(3, 1, 2), want{d: Sample, from: at(2), to: at(3), back: true}},
		{"late stop whole windows back: middle step", at(2), in(0, 1, 2), true, in(3, 1, 2), want{d: Sample, from: at(1), to: at(2), back: true}},
		{"late stop whole windows back: last step", at(1), in(0, 1, 2), true, in(3, 1, 2), want{d: Sample, from: in(0, 1, 2), to: at(1), back: true}},
		{"late stop on a boundary", at(3), at(1), true, in(3, 1, 2), want{d: Sample, from: at(2), to: at(3), back: true}},
		{"late stop on a boundary: last step", at(2), at(1), true, in(3, 1, 2), want{d: Sample, from: at(1), to: at(2), back: true}},
		{"late stop one ms back", at(2), msAt(2, -1), true, in(3, 1, 2), want{d: Sample, from: msAt(2, -1), to: at(2), back: true}},
		{"late stop one ms after a boundary", at(3), msAt(1, 1), true, in(3, 1, 2), want{d: Sample, from: at(2), to: at(3), back: true}},
		{"late stop one ms after a boundary: last step", at(2), msAt(1, 1), true, in(3, 1, 2), want{d: Sample, from: msAt(1, 1), to: at(2), back: true}},
	}
	origins := map[string]int64{
		"mid-2024":        time.Date(2024, 6, 15, 10, 37, 21, 0, time.UTC).UnixMilli(),
		"leap-february":   time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC).UnixMilli(),
		"new-year":        time.Date(2025, 12, 31, 23, 59, 0, 0, time.UTC).UnixMilli(),
		"year-2038-after": time.Date(2040, 7, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	for _, loc := range []*time.Location{nil, ny, kolkata} {
		for _, g := range All() {
			for oname, origin := range origins {
				gr := Grid{G: g, Loc: loc}
				bs := boundaries(gr, origin)
				for _, c := range cases {
					name := fmt.Sprintf("%v/%s/%s/%s", loc, g, oname, c.name)
					end := int64(0)
					if c.stopped {
						end = c.end.ms(bs)
					}
					iv, d, wake := gr.Plan(c.cursor.ms(bs), end, c.stopped, c.now.ms(bs))
					if d != c.want.d {
						t.Errorf("%s: decision %d, want %d (interval %v)", name, d, c.want.d, iv)
						continue
					}
					switch d {
					case Sample:
						w := Interval{Start: c.want.from.ms(bs), End: c.want.to.ms(bs), Backward: c.want.back}
						if iv != w {
							t.Errorf("%s: interval %v, want %v", name, iv, w)
						}
						checkInOneWindow(t, gr, iv, name)
					case Wait:
						if w := c.want.wake.ms(bs); wake != w {
							t.Errorf("%s: wake at %d, want %d", name, wake, w)
						}
					}
				}
			}
		}
	}
}

// checkInOneWindow asserts the interval does not cross a boundary and its
// midpoint lies in the interval's window, with the duration's sign.
func checkInOneWindow(t *testing.T, gr Grid, iv Interval, name string) {
	t.Helper()
	if iv.Start >= iv.End {
		t.Errorf("%s: empty or inverted interval %v", name, iv)
		return
	}
	w := gr.Floor(iv.Start)
	if iv.Backward {
		w = gr.Prev(iv.End)
	}
	if iv.Start < w || iv.End > gr.Next(w) {
		t.Errorf("%s: interval %v crosses a boundary of window [%d,%d)", name, iv, w, gr.Next(w))
	}
	if m := iv.Midpoint(); gr.Floor(m) != w {
		t.Errorf("%s: midpoint %d not in window [%d,%d)", name, m, w, gr.Next(w))
	}
	if (iv.Duration() < 0) != iv.Backward || abs(iv.Duration()) != iv.End-iv.Start {
		t.Errorf("%s: duration %d for %v", name, iv.Duration(), iv)
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// TestGridBoundaries checks Floor/Next/Prev against the calendar, including
// daylight-saving changes and a half-hour zone.
func TestGridBoundaries(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	ms := func(y int, mo time.Month, d, h, mi int, loc *time.Location) int64 {
		return time.Date(y, mo, d, h, mi, 0, 0, loc).UnixMilli()
	}
	cases := []struct {
		gr             Grid
		t, floor, next int64
		name           string
	}{
		{Grid{G: Month}, ms(2024, 2, 29, 12, 0, time.UTC), ms(2024, 2, 1, 0, 0, time.UTC), ms(2024, 3, 1, 0, 0, time.UTC), "leap month"},
		{Grid{G: Month}, ms(2024, 12, 31, 23, 59, time.UTC), ms(2024, 12, 1, 0, 0, time.UTC), ms(2025, 1, 1, 0, 0, time.UTC), "december"},
		{Grid{G: Month, Loc: ny}, ms(2024, 3, 1, 0, 30, ny), ms(2024, 3, 1, 0, 0, ny), ms(2024, 4, 1, 0, 0, ny), "month in New York"},
		{Grid{G: Day, Loc: ny}, ms(2024, 3, 10, 12, 0, ny), ms(2024, 3, 10, 0, 0, ny), ms(2024, 3, 11, 0, 0, ny), "23-hour DST day"},
		{Grid{G: Day, Loc: ny}, ms(2024, 11, 3, 12, 0, ny), ms(2024, 11, 3, 0, 0, ny), ms(2024, 11, 4, 0, 0, ny), "25-hour DST day"},
		{Grid{G: Hour, Loc: kolkata}, ms(2024, 5, 5, 10, 45, kolkata), ms(2024, 5, 5, 10, 0, kolkata), ms(2024, 5, 5, 11, 0, kolkata), "half-hour zone"},
		{Grid{G: Hour}, ms(2024, 5, 5, 10, 45, kolkata), ms(2024, 5, 5, 10, 30, kolkata), ms(2024, 5, 5, 11, 30, kolkata), "UTC hour seen from Kolkata"},
		{Grid{G: Minute}, ms(2024, 5, 5, 10, 45, time.UTC) + 59_999, ms(2024, 5, 5, 10, 45, time.UTC), ms(2024, 5, 5, 10, 46, time.UTC), "last ms of a minute"},
		{Grid{G: Minute}, -1, -60_000, 0, "before the epoch"},
	}
	for _, c := range cases {
		if f := c.gr.Floor(c.t); f != c.floor {
			t.Errorf("%s: floor %d, want %d", c.name, f, c.floor)
		}
		if n := c.gr.Next(c.t); n != c.next {
			t.Errorf("%s: next %d, want %d", c.name, n, c.next)
		}
		if p := c.gr.Prev(c.floor); p >= c.floor || c.gr.Next(p) != c.floor {
			t.Errorf("%s: prev(%d) = %d does not precede it", c.name, c.floor, p)
		}
		if f := c.gr.Floor(c.floor); f != c.floor {
			t.Errorf("%s: floor of a boundary moved it", c.name)
		}
	}
	// Walking hour boundaries through both New York DST changes of 2024:
	// strictly increasing, one hour apart in absolute time.
	gr := Grid{G: Hour, Loc: ny}
	b := gr.Floor(ms(2024, 3, 9, 0, 0, ny))
	for range 24 * 300 {
		n := gr.Next(b)
		if n-b != 3_600_000 {
			t.Fatalf("hour boundaries %d → %d are %d ms apart", b, n, n-b)
		}
		b = n
	}
}

func TestParseGranularity(t *testing.T) {
	for _, g := range All() {
		if p, err := ParseGranularity(g.String()); err != nil || p != g {
			t.Fatalf("%s: %v %v", g, p, err)
		}
	}
	if _, err := ParseGranularity("week"); err == nil {
		t.Fatal("week accepted")
	}
}

// span is the property test's model: what the sampler would hold in raft.
type span struct {
	target     int
	start, end int64
	stopped    bool
	cursor     int64
	planned    *Interval
	plannedID  string
	seq        int
	done       bool
}

type record struct {
	id      string
	target  int
	ts, dur int64
}

// TestConservationProperty drives random starts, stops (late, duplicate and
// out-of-order ones included), crashes between the sink call and the
// recorded execution (a failover: the new leader re-sends the planned id),
// and random clocks, then checks once idle: per target and window the
// durations sum to the true overlap of [start, end), exactly; no usage id is
// accepted twice by the sink; no zero duration is emitted.
func TestConservationProperty(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 17))
		g := All()[r.IntN(4)]
		gr := Grid{G: g}
		if seed%3 == 1 {
			gr.Loc, _ = time.LoadLocation("America/New_York")
		}
		unit := map[Granularity]int64{Minute: 60_000, Hour: 3_600_000, Day: 86_400_000, Month: 31 * 86_400_000}[g]
		now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() + r.Int64N(unit)
		var spans []*span
		truth := map[int][][2]int64{} // target → [start,end) pieces
		open := map[int]*span{}
		seen := map[string]bool{}
		var recs []record
		sink := func(s *span) {
			// The sink dedups by id: a re-send after a failover is dropped.
			if seen[s.plannedID] {
				return
			}
			seen[s.plannedID] = true
			recs = append(recs, record{s.plannedID, s.target, s.planned.Midpoint(), s.planned.Duration()})
		}
		step := func(s *span) {
			if s.done {
				return
			}
			if s.planned == nil {
				iv, d, _ := gr.Plan(s.cursor, s.end, s.stopped, now)
				switch d {
				case Complete:
					s.done = true
				case Sample:
					s.planned = &iv
					s.seq++
					s.plannedID = fmt.Sprintf("%p-%d", s, s.seq)
				}
				return
			}
			sink(s)
			if r.IntN(4) == 0 {
				return // failover after the sink call, before the execution was recorded
			}
			s.cursor = s.planned.Cursor()
			s.planned = nil
		}
		targets := 1 + r.IntN(4)
		for range 60 + r.IntN(100) {
			now += r.Int64N(unit * 2)
			tg := r.IntN(targets)
			switch r.IntN(3) {
			case 0: // start (refused while the target is open, as the receiver does)
				if open[tg] == nil {
					ts := now - r.Int64N(unit*3) // may lie in the past: already elapsed windows
					if last := lastEnd(truth[tg]); ts < last {
						ts = last
					}
					s := &span{target: tg, start: ts, cursor: ts}
					spans = append(spans, s)
					open[tg] = s
				}
			case 1: // stop: late (before what was sampled), on time, or a duplicate
				if s := open[tg]; s != nil {
					end := s.start + r.Int64N(now-s.start+1)
					if r.IntN(5) == 0 {
						end = s.start // zero length
					}
					s.end, s.stopped = end, true
					delete(open, tg)
					truth[tg] = append(truth[tg], [2]int64{s.start, end})
				}
			}
			for _, s := range spans {
				for range r.IntN(4) {
					step(s)
				}
			}
		}
		for tg, s := range open {
			s.end, s.stopped = now, true
			truth[tg] = append(truth[tg], [2]int64{s.start, now})
		}
		now += unit * 40
		for range 100_000 {
			busy := false
			for _, s := range spans {
				if !s.done {
					busy = true
					step(s)
				}
			}
			if !busy {
				break
			}
		}
		for _, s := range spans {
			if !s.done || s.cursor != s.end {
				t.Fatalf("seed %d: span not finished: %+v", seed, s)
			}
		}
		got := map[[2]int64]int64{} // (target, window) → sum
		for _, rc := range recs {
			if rc.dur == 0 {
				t.Fatalf("seed %d: zero-duration record %s", seed, rc.id)
			}
			got[[2]int64{int64(rc.target), gr.Floor(rc.ts)}] += rc.dur
		}
		want := map[[2]int64]int64{}
		for tg, pieces := range truth {
			for _, p := range pieces {
				for w := gr.Floor(p[0]); w < p[1]; w = gr.Next(w) {
					if o := min(p[1], gr.Next(w)) - max(p[0], w); o > 0 {
						want[[2]int64{int64(tg), w}] += o
					}
				}
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("seed %d (%s): target %d window %d: durations sum to %d, overlap is %d", seed, g, k[0], k[1], got[k], v)
			}
		}
		for k, v := range got {
			if want[k] != v {
				t.Fatalf("seed %d (%s): target %d window %d: sum %d where no usage was", seed, g, k[0], k[1], v)
			}
		}
	}
}

func lastEnd(p [][2]int64) int64 {
	if len(p) == 0 {
		return 0
	}
	return p[len(p)-1][1]
}
