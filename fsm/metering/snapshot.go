package metering

import (
	"cmp"
	"math"
	"slices"

	"github.com/tollgate-io/tollgate/metering/interval"
)

const sectionVersion = 1

// Snapshot implements fsm.Module. It encodes at once: it runs on the apply
// goroutine, so the state cannot change meanwhile, and the bytes are the
// immutable copy the returned function hands out.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.spans) == 0 && len(m.dedup) == 0 && m.nrec == 0 && len(m.dead) == 0 && len(m.series) == 0 && m.nextSpan == 1 {
		return nil, nil
	}
	b := m.encodeLocked()
	return func() ([]byte, error) { return b, nil }, nil
}

// encodeLocked writes the section in a canonical order (ids, keys sorted) so
// equal states give equal bytes on every replica.
func (m *Module) encodeLocked() []byte {
	e := enc{}
	e.byte(sectionVersion)
	e.u(m.nextSpan)
	ids := make([]uint64, 0, len(m.spans))
	for id := range m.spans {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	e.u(uint64(len(ids)))
	for _, id := range ids {
		s := m.spans[id]
		e.u(s.ID)
		e.target(s.Target)
		e.measures(s.Measures)
		e.i(s.Start)
		var flags byte
		if s.Stopped {
			flags |= 1
		}
		if s.Planned != nil {
			flags |= 2
			if s.Planned.Backward {
				flags |= 4
			}
		}
		e.byte(flags)
		if s.Stopped {
			e.i(s.End)
		}
		e.i(s.Cursor)
		e.u(s.Version)
		e.u(s.Seq)
		if s.Planned != nil {
			e.i(s.Planned.Start)
			e.i(s.Planned.End)
		}
		e.str(s.StartID)
		e.str(s.StopID)
	}
	keys := make([]dedupKey, 0, len(m.dedup))
	for k := range m.dedup {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b dedupKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.id, b.id))
	})
	e.u(uint64(len(keys)))
	for _, k := range keys {
		d := m.dedup[k]
		e.byte(byte(k.kind))
		e.str(k.id)
		e.b = append(e.b, byte(d.fp), byte(d.fp>>8), byte(d.fp>>16), byte(d.fp>>24), byte(d.fp>>32), byte(d.fp>>40), byte(d.fp>>48), byte(d.fp>>56))
		e.i(d.expires)
	}
	tkeys := make([]string, 0, len(m.ledger))
	for k := range m.ledger {
		tkeys = append(tkeys, k)
	}
	slices.Sort(tkeys)
	e.u(uint64(m.nrec))
	for _, k := range tkeys {
		for i := range m.ledger[k] {
			appendRecord(&e, &m.ledger[k][i])
		}
	}
	e.u(uint64(len(m.dead)))
	for i := range m.dead {
		d := &m.dead[i]
		appendRecord(&e, &d.Record)
		e.u(uint64(d.Code))
		e.str(d.Reason)
		e.i(d.At)
	}
	tenants := make([]string, 0, len(m.series))
	n := 0
	for t, ss := range m.series {
		tenants = append(tenants, t)
		n += len(ss)
	}
	slices.Sort(tenants)
	e.u(uint64(n))
	for _, t := range tenants {
		for _, s := range m.series[t] {
			e.str(t)
			e.i(s.minute)
			e.u(uint64(s.active))
		}
	}
	e.i(m.lastNow)
	return e.b
}

// appendRecord: string usage id, span id, target, varint timestamp, varint
// start, varint end, byte backward, measures.
func appendRecord(e *enc, r *Record) {
	e.str(r.UsageID)
	e.u(r.Span)
	e.target(r.Target)
	e.i(r.Timestamp)
	e.i(r.Start)
	e.i(r.End)
	if r.Backward {
		e.byte(1)
	} else {
		e.byte(0)
	}
	e.measures(r.Measures)
}

func readRecord(d *dec) Record {
	r := Record{UsageID: d.str("usage id"), Span: d.u("span id"), Target: d.target(), Timestamp: d.i("timestamp"), Start: d.i("start"), End: d.i("end")}
	switch d.byte("backward") {
	case 0:
	case 1:
		r.Backward = true
	default:
		d.fail("backward byte")
	}
	r.Measures = d.measures(MaxMeasures + 1)
	return r
}

type state struct {
	nextSpan uint64
	spans    map[uint64]*Span
	open     map[string]uint64
	dedup    map[dedupKey]dedupRec
	ledger   map[string][]Record
	nrec     int
	dead     []DeadLetter
	series   map[string][]sample
	lastNow  int64
}

func decodeSection(b []byte) (*state, error) {
	st := &state{nextSpan: 1, spans: map[uint64]*Span{}, open: map[string]uint64{}, dedup: map[dedupKey]dedupRec{},
		ledger: map[string][]Record{}, series: map[string][]sample{}}
	if b == nil {
		return st, nil
	}
	d := dec{b: b}
	if v := d.byte("section version"); d.err == nil && v != sectionVersion {
		d.fail("section version %d (this build reads %d)", v, sectionVersion)
	}
	st.nextSpan = d.u("next span id")
	n := d.count("span count", uint64(len(b)))
	for range n {
		if d.err != nil {
			break
		}
		s := &Span{ID: d.u("span id"), Target: d.target(), Measures: d.measures(MaxMeasures), Start: d.i("start")}
		flags := d.byte("flags")
		if flags&^7 != 0 || flags&6 == 4 {
			d.fail("span flags %#x", flags)
		}
		if flags&1 != 0 {
			s.Stopped = true
			s.End = d.i("end")
		}
		s.Cursor = d.i("cursor")
		s.Version = d.u("version")
		s.Seq = d.u("seq")
		if flags&2 != 0 {
			s.Planned = &interval.Interval{Start: d.i("planned start"), End: d.i("planned end"), Backward: flags&4 != 0}
		}
		s.StartID = d.str("start id")
		s.StopID = d.str("stop id")
		if d.err != nil {
			break
		}
		if s.ID == 0 || s.ID >= st.nextSpan || st.spans[s.ID] != nil {
			d.fail("span id %d (next %d) duplicate or out of range", s.ID, st.nextSpan)
			break
		}
		st.spans[s.ID] = s
		if !s.Stopped {
			k := s.Target.key()
			if _, dup := st.open[k]; dup {
				d.fail("two open spans for one target")
				break
			}
			st.open[k] = s.ID
		}
	}
	n = d.count("dedup count", uint64(len(b)))
	for range n {
		if d.err != nil {
			break
		}
		k := dedupKey{kind: Kind(d.byte("kind")), id: d.str("id")}
		fp := d.u64("fingerprint")
		st.dedup[k] = dedupRec{fp: fp, expires: d.i("expires")}
	}
	n = d.count("record count", uint64(len(b)))
	for range n {
		if d.err != nil {
			break
		}
		r := readRecord(&d)
		k := r.Target.key()
		st.ledger[k] = append(st.ledger[k], r)
		st.nrec++
	}
	n = d.count("dead letter count", uint64(len(b)))
	for range n {
		if d.err != nil {
			break
		}
		r := readRecord(&d)
		st.dead = append(st.dead, DeadLetter{Record: r, Code: int(d.u("code")), Reason: d.strMax("reason", maxReason), At: d.i("at")})
	}
	n = d.count("sample count", uint64(len(b)))
	for range n {
		if d.err != nil {
			break
		}
		t := d.str("tenant")
		s := sample{minute: d.i("minute"), active: int64(d.u("active") & math.MaxInt64)}
		if ss := st.series[t]; len(ss) > 0 && ss[len(ss)-1].minute >= s.minute {
			d.fail("series samples of %q out of order", t)
			break
		}
		st.series[t] = append(st.series[t], s)
	}
	st.lastNow = d.i("now")
	d.end()
	if d.err != nil {
		return nil, d.err
	}
	return st, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	st, err := decodeSection(data)
	if err != nil {
		return nil, err
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.nextSpan, m.spans, m.open, m.dedup = st.nextSpan, st.spans, st.open, st.dedup
		m.ledger, m.nrec, m.dead, m.series, m.lastNow = st.ledger, st.nrec, st.dead, st.series, st.lastNow
		m.changes.Add(1)
	}, nil
}
