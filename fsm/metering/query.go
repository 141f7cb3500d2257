package metering

import (
	"cmp"
	"slices"

	"github.com/tollgate-io/tollgate/metering/interval"
)

// Work is what the sampler must do next for one span: execute its planned
// interval (Plan == nil), or propose Plan.
type Work struct {
	Span    Span // a copy
	Plan    *PlanItem
	Record  Record // the planned interval's record (when executing)
	UsageID string
}

// Due lists up to limit spans that need work at now under grid, oldest
// cursor first, and the earliest time a waiting span becomes due (0 when
// none waits). It reads only the spans the due index (dueindex.go) has
// filed as due by now, so its cost follows the due spans, not all spans.
func (m *Module) Due(grid interval.Grid, now int64, limit int, skip func(span uint64) bool) (work []Work, wakeAt int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	x := &m.due
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.built || x.grid != grid {
		x.rebuild(grid, m.spans)
	}
	x.advance(now, m.spans)
	for id := range x.ready {
		s := m.spans[id]
		if s == nil {
			delete(x.ready, id) // removed since it was filed
			continue
		}
		if skip != nil && skip(s.ID) {
			continue
		}
		if s.Planned != nil {
			work = append(work, Work{Span: *s, Record: m.record(s), UsageID: s.UsageID(m.group)})
			continue
		}
		iv, d, wake := grid.Plan(s.Cursor, s.End, s.Stopped, now)
		switch d {
		case interval.Sample:
			work = append(work, Work{Span: *s, Plan: &PlanItem{Span: s.ID, Version: s.Version, Start: iv.Start, End: iv.End, Backward: iv.Backward}})
		case interval.Wait:
			// Filed early (Due asked with an earlier now than before): back
			// under its instant.
			delete(x.ready, id)
			x.file(id, wake)
		default:
			delete(x.ready, id)
		}
	}
	wakeAt = x.next(m.spans)
	slices.SortFunc(work, func(a, b Work) int {
		return cmp.Or(cmp.Compare(a.Span.Cursor, b.Span.Cursor), cmp.Compare(a.Span.ID, b.Span.ID))
	})
	if len(work) > limit {
		work = work[:limit]
	}
	return work, wakeAt
}

// Stats summarises the module for status and metrics.
type Stats struct {
	SpansOpen    int   // started, not stopped
	Spans        int   // open plus stopped but not fully sampled
	Planned      int   // spans with a planned, not yet executed interval
	Pending      int   // spans with work due at the asked time
	Records      int   // ledger records
	DeadLetters  int   // records the HTTP sink refused
	OldestCursor int64 // smallest sampled point over unfinished spans (0 when none)
	OldestDue    int64 // smallest cursor among spans with work due (0 when none): the oldest unsampled boundary
	LastNow      int64 // latest leader time applied
	PlannedTotal int64 // intervals planned / executed by this replica since it started (metrics)
	Executed     int64
	// SeriesTenants counts the tenants with active-series samples;
	// SeriesBytes is the memory their samples hold (SeriesBytes per tenant,
	// summed): the open month at full resolution, closed months compacted.
	SeriesTenants int
	SeriesBytes   int
}

// Stats returns the module's state summary at now under grid.
func (m *Module) Stats(grid interval.Grid, now int64) Stats {
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := Stats{SpansOpen: len(m.open), Spans: len(m.spans), Records: m.nrec, DeadLetters: len(m.dead), LastNow: m.lastNow,
		PlannedTotal: m.planned, Executed: m.executed, SeriesTenants: len(m.series)}
	for _, ts := range m.series {
		st.SeriesBytes += ts.bytes()
	}
	for _, s := range m.spans {
		if st.OldestCursor == 0 || s.Cursor < st.OldestCursor {
			st.OldestCursor = s.Cursor
		}
		due := s.Planned != nil
		if s.Planned != nil {
			st.Planned++
		} else if _, d, _ := grid.Plan(s.Cursor, s.End, s.Stopped, now); d == interval.Sample {
			due = true
		}
		if due {
			st.Pending++
			if st.OldestDue == 0 || s.Cursor < st.OldestDue {
				st.OldestDue = s.Cursor
			}
		}
	}
	return st
}

// Filter selects ledger records: empty target fields match anything;
// timestamps in [From, To) (To 0: no upper bound).
type Filter struct {
	Target   Target
	From, To int64
	Limit    int // 0: no limit
}

func (f *Filter) match(t Target) bool {
	a, b := f.Target.Fields(), t.Fields()
	for i := range a {
		if a[i] != "" && a[i] != b[i] {
			return false
		}
	}
	return true
}

// Query returns the ledger records matching f, by timestamp then usage id.
func (m *Module) Query(f Filter) []Record {
	m.mu.RLock()
	var out []Record
	keep := func(recs []Record) {
		for _, r := range recs {
			if r.Timestamp >= f.From && (f.To == 0 || r.Timestamp < f.To) {
				out = append(out, r)
			}
		}
	}
	fields := f.Target.Fields()
	full := true
	for _, s := range fields {
		if s == "" {
			full = false
		}
	}
	if full {
		keep(m.ledger[f.Target.key()])
	} else {
		for _, recs := range m.ledger {
			if len(recs) > 0 && f.match(recs[0].Target) {
				keep(recs)
			}
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Timestamp, b.Timestamp), cmp.Compare(a.UsageID, b.UsageID))
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out
}

// DeadLetters returns the records the HTTP sink refused, oldest first.
func (m *Module) DeadLetters() []DeadLetter {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.dead)
}

// Spans returns copies of the unfinished spans, by id.
func (m *Module) Spans() []Span {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Span, 0, len(m.spans))
	for _, s := range m.spans {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Span) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Sample is one tenant's active series in this group at a minute.
type Sample struct {
	Minute int64
	Active int64
}

// SeriesSamples returns the tenant's samples with minute in [from, to) (to
// 0: no bound), led, when withPrior is set and none is at from, by its
// latest sample before from (the count in force at from: a sample holds
// until the next) — SeriesWindow's rows, for one tenant. It reads only
// that range (binary search): a tenant's retained history can hold a sample
// a minute for the whole ledger retention.
func (m *Module) SeriesSamples(tenant string, from, to int64, withPrior bool) []Sample {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ts := m.series[tenant]
	if ts == nil {
		return nil
	}
	return ts.window(from, to, withPrior)
}

// SeriesWindow returns every tenant's samples with minute in [from, to),
// each tenant's list led by its latest sample before from when there is one
// (the count in force at from: a sample holds until the next). Tenants with
// no sample before to are left out. It reads only the window (binary search;
// compacted months only when the window reaches into them), so a month's
// bills do not walk the whole retained history.
func (m *Module) SeriesWindow(from, to int64) map[string][]Sample {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[string][]Sample{}
	for t, ts := range m.series {
		if w := ts.window(from, to, true); len(w) > 0 {
			out[t] = w
		}
	}
	return out
}

// LastSample returns the tenant's latest active-series sample in this group.
func (m *Module) LastSample(tenant string) (int64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ts := m.series[tenant]
	if ts == nil {
		return 0, false
	}
	s, ok := ts.latest()
	return s.active, ok
}

// SeriesBytes is the memory (bytes) the tenant's active-series samples hold
// in this group: the open month at 16 bytes a sample (plus the slack of its
// array), closed months compacted (series.go). The map entry and the
// tenant's name are not counted. It is how the memory bound per tenant and
// retained month is checked.
func (m *Module) SeriesBytes(tenant string) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ts := m.series[tenant]
	if ts == nil {
		return 0
	}
	return ts.bytes()
}

// HasState reports whether anything could expire: dedup ids, ledger
// records or samples (housekeeping ticks are skipped otherwise).
func (m *Module) HasState() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.dedup) > 0 || m.nrec > 0 || len(m.series) > 0
}
