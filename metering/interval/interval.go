package interval

import (
	"fmt"
	"strings"
	"time"
)

// Granularity is the width of the windows intervals never cross.
type Granularity uint8

// Granularities, in increasing width. The numeric values are stored in raft
// entries and snapshots; never renumber them.
const (
	Minute Granularity = 1
	Hour   Granularity = 2
	Day    Granularity = 3
	Month  Granularity = 4
)

// Granularities lists every granularity (tests, help texts).
var granularities = [...]Granularity{Minute, Hour, Day, Month}

// All returns every granularity in increasing width.
func All() []Granularity { return granularities[:] }

func (g Granularity) String() string {
	switch g {
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Month:
		return "month"
	}
	return fmt.Sprintf("granularity(%d)", uint8(g))
}

// Valid reports whether g is one of the four granularities.
func (g Granularity) Valid() bool { return g >= Minute && g <= Month }

// ParseGranularity reads "minute", "hour", "day" or "month".
func ParseGranularity(s string) (Granularity, error) {
	for _, g := range granularities {
		if strings.EqualFold(s, g.String()) {
			return g, nil
		}
	}
	return 0, fmt.Errorf("granularity %q: want minute, hour, day or month", s)
}

// Grid is a granularity in a location: the set of boundaries.
//
// Minute and hour boundaries are found from the zone offset in effect at the
// instant (zones whose offsets are whole minutes, respectively whole hours,
// keep them aligned through daylight-saving changes); day and month
// boundaries are local midnights from the calendar.
type Grid struct {
	G   Granularity
	Loc *time.Location // nil means UTC
}

func (gr Grid) loc() *time.Location {
	if gr.Loc == nil {
		return time.UTC
	}
	return gr.Loc
}

// Floor returns the largest boundary ≤ t.
func (gr Grid) Floor(t int64) int64 {
	loc := gr.loc()
	tt := time.UnixMilli(t).In(loc)
	switch gr.G {
	case Minute, Hour:
		unit := int64(time.Minute / time.Millisecond)
		if gr.G == Hour {
			unit = int64(time.Hour / time.Millisecond)
		}
		_, off := tt.Zone()
		local := t + int64(off)*1000
		return local - mod(local, unit) - int64(off)*1000
	case Day:
		b := time.Date(tt.Year(), tt.Month(), tt.Day(), 0, 0, 0, 0, loc).UnixMilli()
		if b > t { // a midnight that does not exist locally resolved forward
			b = time.Date(tt.Year(), tt.Month(), tt.Day()-1, 0, 0, 0, 0, loc).UnixMilli()
		}
		return b
	case Month:
		b := time.Date(tt.Year(), tt.Month(), 1, 0, 0, 0, 0, loc).UnixMilli()
		if b > t {
			b = time.Date(tt.Year(), tt.Month()-1, 1, 0, 0, 0, 0, loc).UnixMilli()
		}
		return b
	}
	panic(fmt.Sprintf("interval: invalid granularity %d", gr.G)) // validated at configuration
}

// Next returns the smallest boundary > t.
func (gr Grid) Next(t int64) int64 {
	f := gr.Floor(t)
	loc := gr.loc()
	var n int64
	switch gr.G {
	case Minute:
		n = f + int64(time.Minute/time.Millisecond)
	case Hour:
		n = f + int64(time.Hour/time.Millisecond)
	case Day:
		ft := time.UnixMilli(f).In(loc)
		n = time.Date(ft.Year(), ft.Month(), ft.Day()+1, 0, 0, 0, 0, loc).UnixMilli()
	case Month:
		ft := time.UnixMilli(f).In(loc)
		n = time.Date(ft.Year(), ft.Month()+1, 1, 0, 0, 0, 0, loc).UnixMilli()
	}
	if n <= t {
		// Offset changes can make a calendar step land at or before t;
		// the next window's floor is then the boundary after it.
		return gr.Next(t + 1)
	}
	// A minute/hour step across an offset change lands off the grid of the
	// new offset: the boundary is then that instant's own floor, if later than t.
	if g := gr.Floor(n); g > t && g < n {
		return g
	}
	return n
}

// Prev returns the largest boundary < t.
func (gr Grid) Prev(t int64) int64 { return gr.Floor(t - 1) }

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// Interval is one planned sample of a span. Start < End always; Backward says
// the interval is (Start, End] and subtracts time, else it is [Start, End).
type Interval struct {
	Start, End int64
	Backward   bool
}

// Duration is the signed duration measure in milliseconds.
func (iv Interval) Duration() int64 {
	if iv.Backward {
		return iv.Start - iv.End
	}
	return iv.End - iv.Start
}

// Midpoint is the usage timestamp: ⌊(Start+End)/2⌋, inside the interval's
// window for both directions.
func (iv Interval) Midpoint() int64 {
	return iv.Start + (iv.End-iv.Start)/2
}

// Cursor is where the span's sampled point moves once the interval executes.
func (iv Interval) Cursor() int64 {
	if iv.Backward {
		return iv.Start
	}
	return iv.End
}

func (iv Interval) String() string {
	if iv.Backward {
		return fmt.Sprintf("(%d,%d] backward", iv.Start, iv.End)
	}
	return fmt.Sprintf("[%d,%d)", iv.Start, iv.End)
}

// Decision is what Plan found for a span.
type Decision uint8

const (
	// Wait: nothing to sample before WakeAt.
	Wait Decision = iota
	// Sample: the returned interval is due.
	Sample
	// Complete: the span is stopped and fully sampled.
	Complete
)

// Plan picks the next interval of a span whose sampled point is cursor.
// stopped says whether the span has an end; now is the planner's clock. On
// Wait, wakeAt is the earliest time at which Plan may return something else
// (for an unchanged span).
func (gr Grid) Plan(cursor int64, end int64, stopped bool, now int64) (iv Interval, d Decision, wakeAt int64) {
	if stopped {
		switch {
		case cursor == end:
			return Interval{}, Complete, 0
		case end < cursor:
			// Late stop: walk back, never past the previous boundary.
			return Interval{Start: max(end, gr.Prev(cursor)), End: cursor, Backward: true}, Sample, 0
		case end <= now:
			return Interval{Start: cursor, End: min(end, gr.Next(cursor))}, Sample, 0
		}
	}
	// Open, or stopped in the future: only whole elapsed windows.
	if f := gr.Floor(now); f > cursor {
		return Interval{Start: cursor, End: min(f, gr.Next(cursor))}, Sample, 0
	}
	wakeAt = gr.Next(cursor)
	if stopped {
		wakeAt = min(wakeAt, end)
	}
	return Interval{}, Wait, wakeAt
}
