package history

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// meterEvent is one applied metering event.
type meterEvent struct {
	id   string
	time int64
	stop bool
}

// meterState is a resource instance's applied events, sorted by id and
// encoded as a string so that states compare with ==.
type meterState string

func (s meterState) events() []meterEvent {
	if s == "" {
		return nil
	}
	var out []meterEvent
	for _, f := range strings.Split(string(s), ";") {
		var e meterEvent
		var kind string
		i := strings.LastIndexByte(f, '@')
		e.id = f[:i]
		_, _ = fmt.Sscanf(f[i+1:], "%d:%s", &e.time, &kind)
		e.stop = kind == "stop"
		out = append(out, e)
	}
	return out
}

// with returns s plus op's event; an id already applied changes nothing
// (events are idempotent by id).
func (s meterState) with(op Op) meterState {
	evs := s.events()
	if slices.ContainsFunc(evs, func(e meterEvent) bool { return e.id == op.ID }) {
		return s
	}
	evs = append(evs, meterEvent{op.ID, op.Time, op.Stop})
	slices.SortFunc(evs, func(a, b meterEvent) int { return strings.Compare(a.id, b.id) })
	parts := make([]string, len(evs))
	for i, e := range evs {
		kind := "start"
		if e.stop {
			kind = "stop"
		}
		parts[i] = fmt.Sprintf("%s@%d:%s", e.id, e.time, kind)
	}
	return meterState(strings.Join(parts, ";"))
}

// meterUsage is the exact usage of a resource instance's events: in
// timestamp order a start opens a span (if none is open) and a stop closes
// it; each closed span's duration is split over the windows (of window ms,
// aligned at 0) it overlaps. A span still open has no usage yet.
func meterUsage(evs []meterEvent, window int64) map[int64]int64 {
	evs = slices.Clone(evs)
	slices.SortStableFunc(evs, func(a, b meterEvent) int {
		if a.time != b.time {
			return int(min(max(a.time-b.time, -1), 1))
		}
		return strings.Compare(a.id, b.id)
	})
	out := map[int64]int64{}
	open, from := false, int64(0)
	for _, e := range evs {
		switch {
		case !e.stop && !open:
			open, from = true, e.time
		case e.stop && open:
			open = false
			for w := floorDiv(from, window) * window; w < e.time; w += window {
				if o := min(e.time, w+window) - max(from, w); o > 0 {
					out[w] += o
				}
			}
		}
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// MeteringModel checks KindMeterEvent and KindMeterUsage operations per
// resource instance (Op.Key): events are idempotent by id (a retried or
// duplicated event counts once), and a usage read must give, per window of
// window ms, exactly the duration of the spans the applied events make
// (MeterUsage) — no window missing, none counted twice, none invented. An
// event with an unknown outcome may or may not have been applied; a failed
// one was not. Usage is produced asynchronously (sampled after the fact), so
// a history's usage reads must be taken once the samplers are caught up.
func MeteringModel(window int64) Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []any { return []any{meterState("")} },
		Step: func(state, input, _ any) []any {
			s, op := state.(meterState), input.(Op)
			switch op.Kind {
			case KindMeterEvent:
				switch op.Outcome {
				case OK:
					return []any{s.with(op)}
				case Unknown:
					if n := s.with(op); n != s {
						return []any{s, n}
					}
				}
				return []any{s}
			case KindMeterUsage:
				if op.Outcome != OK {
					return []any{s}
				}
				if maps.Equal(meterUsage(s.events(), window), nonZero(op.Usage)) {
					return []any{s}
				}
			}
			return nil
		},
		DescribeOperation: func(input, _ any) string {
			op := input.(Op)
			if op.Kind == KindMeterUsage {
				return fmt.Sprintf("usage → %s %v", op.Outcome, op.Usage)
			}
			kind := "start"
			if op.Stop {
				kind = "stop"
			}
			return fmt.Sprintf("%s %s@%d → %s %s", kind, op.ID, op.Time, op.Outcome, op.Err)
		},
		DescribeState: func(s any) string {
			return fmt.Sprintf("%s → usage %v", s, meterUsage(s.(meterState).events(), window))
		},
	}
	return Model{name: "metering", kinds: []Kind{KindMeterEvent, KindMeterUsage}, pm: nm.ToModel()}
}

// nonZero drops windows of zero usage: a read may list them or not.
func nonZero(u map[int64]int64) map[int64]int64 {
	out := map[int64]int64{}
	for w, d := range u {
		if d != 0 {
			out[w] = d
		}
	}
	return out
}
