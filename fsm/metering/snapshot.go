package metering

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/metering/interval"
)

// The section's versions: 1 until the switch (meter-targets) or a partition
// move, 2 after (move.go), so a replica of an older build reads every
// section written before the cluster could have used either.
const (
	sectionVersion   = 1
	sectionVersionV2 = 2
)

// Snapshot implements fsm.Module. It encodes at once: it runs on the apply
// goroutine, so the state cannot change meanwhile, and the bytes are the
// immutable copy the returned function hands out.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.spans) == 0 && len(m.dedup) == 0 && m.nrec == 0 && len(m.dead) == 0 && len(m.series) == 0 && m.nextSpan == 1 && !m.v2() {
		return nil, nil
	}
	b := m.encodeLocked()
	return func() ([]byte, error) { return b, nil }, nil
}

// encodeLocked writes the section in a canonical order (ids, keys sorted) so
// equal states give equal bytes on every replica.
func (m *Module) encodeLocked() []byte {
	v2 := m.v2()
	e := wire.Encoder{}
	if v2 {
		e.Byte(sectionVersionV2)
	} else {
		e.Byte(sectionVersion)
	}
	e.Uvarint(m.nextSpan)
	ids := make([]uint64, 0, len(m.spans))
	for id := range m.spans {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	e.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		appendSpan(&e, m.spans[id], v2)
	}
	keys := make([]dedupKey, 0, len(m.dedup))
	for k := range m.dedup {
		keys = append(keys, k)
	}
	sortDedup(keys)
	e.Uvarint(uint64(len(keys)))
	for _, k := range keys {
		appendDedup(&e, k, m.dedup[k], v2)
	}
	tkeys := make([]string, 0, len(m.ledger))
	for k := range m.ledger {
		tkeys = append(tkeys, k)
	}
	slices.Sort(tkeys)
	e.Uvarint(uint64(m.nrec))
	for _, k := range tkeys {
		for i := range m.ledger[k] {
			appendRecord(&e, &m.ledger[k][i])
		}
	}
	e.Uvarint(uint64(len(m.dead)))
	for i := range m.dead {
		d := &m.dead[i]
		appendRecord(&e, &d.Record)
		e.Uvarint(uint64(d.Code))
		e.String(d.Reason)
		e.Varint(d.At)
	}
	// Compacted samples are written as every sample: the section is the one
	// builds without compaction write and read.
	tenants := make([]string, 0, len(m.series))
	n := 0
	for t, ts := range m.series {
		tenants = append(tenants, t)
		n += ts.count()
	}
	slices.Sort(tenants)
	e.Uvarint(uint64(n))
	for _, t := range tenants {
		for _, s := range m.series[t].all() {
			e.String(t)
			e.Varint(s.minute)
			e.Uvarint(uint64(s.active))
		}
	}
	e.Varint(m.lastNow)
	if v2 {
		e.Bool(m.hashes)
		e.Bool(m.moved)
		if m.moved {
			e.Uvarint(uint64(len(m.owned)))
			var owned []uint64
			for p, o := range m.owned {
				if o {
					owned = append(owned, uint64(p))
				}
			}
			e.Uvarint(uint64(len(owned)))
			for _, p := range owned {
				e.Uvarint(p)
			}
		}
	}
	return e.Buf
}

// v2 reports whether the section is written at version 2: after the switch
// or a partition's metering moved, both of which need every replica at
// TargetsClusterVersion.
func (m *Module) v2() bool { return m.hashes || m.moved }

// appendSpan: uvarint id, target, measures, varint start, byte flags (1
// stopped, 2 planned, 4 planned backward), [varint end], varint cursor,
// uvarint version, uvarint seq, [varint planned start, varint planned end],
// string start id, string stop id; version 2 only: uvarint origin span (0:
// none), [uvarint origin group].
func appendSpan(e *wire.Encoder, s *Span, v2 bool) {
	e.Uvarint(s.ID)
	appendTarget(e, s.Target)
	appendMeasures(e, s.Measures)
	e.Varint(s.Start)
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
	e.Byte(flags)
	if s.Stopped {
		e.Varint(s.End)
	}
	e.Varint(s.Cursor)
	e.Uvarint(s.Version)
	e.Uvarint(s.Seq)
	if s.Planned != nil {
		e.Varint(s.Planned.Start)
		e.Varint(s.Planned.End)
	}
	e.String(s.StartID)
	e.String(s.StopID)
	if v2 {
		e.Uvarint(s.OriginSpan)
		if s.OriginSpan != 0 {
			e.Uvarint(uint64(s.OriginGroup))
		}
	}
}

func readSpan(d *wire.Decoder, v2 bool) *Span {
	s := &Span{ID: d.Uvarint("span id"), Target: readTarget(d), Measures: readMeasures(d, MaxMeasures), Start: d.Varint("start")}
	flags := d.Byte("flags")
	if flags&^7 != 0 || flags&6 == 4 {
		d.Failf("span flags %#x", flags)
	}
	if flags&1 != 0 {
		s.Stopped = true
		s.End = d.Varint("end")
	}
	s.Cursor = d.Varint("cursor")
	s.Version = d.Uvarint("version")
	s.Seq = d.Uvarint("seq")
	if flags&2 != 0 {
		s.Planned = &interval.Interval{Start: d.Varint("planned start"), End: d.Varint("planned end"), Backward: flags&4 != 0}
	}
	s.StartID = d.String("start id", MaxIDLen)
	s.StopID = d.String("stop id", MaxIDLen)
	if v2 {
		s.OriginSpan = d.Uvarint("origin span")
		if s.OriginSpan != 0 {
			s.OriginGroup = int(d.Uvarint("origin group") & math.MaxInt32)
		}
	}
	return s
}

// appendDedup: byte kind, string id, 8 bytes fingerprint LE, varint
// expires_ms; version 2 only: byte known, [8 bytes target hash LE].
func appendDedup(e *wire.Encoder, k dedupKey, d dedupRec, v2 bool) {
	e.Byte(byte(k.kind))
	e.String(k.id)
	e.Uint64(d.fp)
	e.Varint(d.expires)
	if v2 {
		e.Bool(d.known)
		if d.known {
			e.Uint64(d.th)
		}
	}
}

func readDedup(d *wire.Decoder, v2 bool) (dedupKey, dedupRec) {
	k := dedupKey{kind: Kind(d.Byte("kind")), id: d.String("id", MaxIDLen)}
	r := dedupRec{fp: d.Uint64("fingerprint"), expires: d.Varint("expires")}
	if v2 && d.Bool("target hash known") {
		r.th, r.known = d.Uint64("target hash"), true
	}
	return k, r
}

func sortDedup(keys []dedupKey) {
	slices.SortFunc(keys, func(a, b dedupKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.id, b.id))
	})
}

// appendRecord: string usage id, span id, target, varint timestamp, varint
// start, varint end, byte backward, measures.
func appendRecord(e *wire.Encoder, r *Record) {
	e.String(r.UsageID)
	e.Uvarint(r.Span)
	appendTarget(e, r.Target)
	e.Varint(r.Timestamp)
	e.Varint(r.Start)
	e.Varint(r.End)
	e.Bool(r.Backward)
	appendMeasures(e, r.Measures)
}

func readRecord(d *wire.Decoder) Record {
	return Record{UsageID: d.String("usage id", MaxIDLen), Span: d.Uvarint("span id"), Target: readTarget(d),
		Timestamp: d.Varint("timestamp"), Start: d.Varint("start"), End: d.Varint("end"), Backward: d.Bool("backward"),
		Measures: readMeasures(d, MaxMeasures+1)}
}

type state struct {
	nextSpan  uint64
	spans     map[uint64]*Span
	open      map[string]uint64
	dedup     map[dedupKey]dedupRec
	ledger    map[string][]Record
	nrec      int
	dead      []DeadLetter
	series    map[string]*tenantSeries
	openMonth int64
	lastNow   int64
	// version 2
	hashes bool
	moved  bool
	owned  []bool
}

func decodeSection(b []byte) (*state, error) {
	st := &state{nextSpan: 1, spans: map[uint64]*Span{}, open: map[string]uint64{}, dedup: map[dedupKey]dedupRec{},
		ledger: map[string][]Record{}, series: map[string]*tenantSeries{}}
	if b == nil {
		return st, nil
	}
	d := wire.NewDecoder(b, ErrBadPayload)
	v := d.Byte("section version")
	if d.Err() == nil && v != sectionVersion && v != sectionVersionV2 {
		d.Failf("section version %d (this build reads %d and %d)", v, sectionVersion, sectionVersionV2)
	}
	v2 := v == sectionVersionV2
	st.nextSpan = d.Uvarint("next span id")
	n := d.Count("span count", len(b))
	for range n {
		if d.Err() != nil {
			break
		}
		s := readSpan(&d, v2)
		if d.Err() != nil {
			break
		}
		if s.ID == 0 || s.ID >= st.nextSpan || st.spans[s.ID] != nil {
			d.Failf("span id %d (next %d) duplicate or out of range", s.ID, st.nextSpan)
			break
		}
		st.spans[s.ID] = s
		if !s.Stopped {
			k := s.Target.key()
			if _, dup := st.open[k]; dup {
				d.Failf("two open spans for one target")
				break
			}
			st.open[k] = s.ID
		}
	}
	n = d.Count("dedup count", len(b))
	for range n {
		if d.Err() != nil {
			break
		}
		k, r := readDedup(&d, v2)
		st.dedup[k] = r
	}
	n = d.Count("record count", len(b))
	for range n {
		if d.Err() != nil {
			break
		}
		r := readRecord(&d)
		k := r.Target.key()
		st.ledger[k] = append(st.ledger[k], r)
		st.nrec++
	}
	n = d.Count("dead letter count", len(b))
	for range n {
		if d.Err() != nil {
			break
		}
		r := readRecord(&d)
		st.dead = append(st.dead, DeadLetter{Record: r, Code: int(d.Uvarint("code")), Reason: d.String("reason", maxReason), At: d.Varint("at")})
	}
	n = d.Count("sample count", len(b))
	latest := int64(math.MinInt64)
	for range n {
		if d.Err() != nil {
			break
		}
		t := d.String("tenant", MaxIDLen)
		s := sample{minute: d.Varint("minute"), active: int64(d.Uvarint("active") & math.MaxInt64)}
		ts := st.series[t]
		if ts == nil {
			ts = &tenantSeries{}
			st.series[t] = ts
		}
		if n := len(ts.open); n > 0 && ts.open[n-1].minute >= s.minute {
			d.Failf("series samples of %q out of order", t)
			break
		}
		ts.open = append(ts.open, s)
		latest = max(latest, s.minute)
	}
	st.lastNow = d.Varint("now")
	if v2 {
		st.hashes = d.Bool("hashes")
		if st.moved = d.Bool("moved"); st.moved {
			np := int(d.Uvarint("partitions") & math.MaxInt32)
			if d.Err() == nil && (np < 1 || np > maxPartitions) {
				d.Failf("%d partitions", np)
			}
			if d.Err() == nil {
				st.owned = make([]bool, np)
			}
			k := d.Count("owned count", np)
			last := -1
			for range k {
				p := int(d.Uvarint("owned partition") & math.MaxInt32)
				if d.Err() == nil && (p <= last || p >= np) {
					d.Failf("owned partition %d out of order or range", p)
				}
				if d.Err() != nil {
					break
				}
				st.owned[p], last = true, p
			}
		}
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	// The section holds every sample: compact the months before the open
	// one (the month of the latest now or sample), as the replica that wrote
	// it had, or as this build would have had it been the writer.
	if st.lastNow > 0 {
		st.openMonth = max(st.openMonth, monthStart(floorDiv(st.lastNow, 60_000)))
	}
	if len(st.series) > 0 {
		st.openMonth = max(st.openMonth, monthStart(latest))
	}
	for _, ts := range st.series {
		ts.compact(st.openMonth)
	}
	return st, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	st, err := decodeSection(data)
	if err != nil {
		return nil, err
	}
	if st.moved && len(st.owned) != m.partitions {
		return nil, fmt.Errorf("%w: section of %d partitions restored into group %d of a cluster of %d", ErrBadPayload, len(st.owned), m.group, m.partitions)
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.nextSpan, m.spans, m.open, m.dedup = st.nextSpan, st.spans, st.open, st.dedup
		m.ledger, m.nrec, m.dead, m.series, m.lastNow = st.ledger, st.nrec, st.dead, st.series, st.lastNow
		m.openMonth, m.compactQ = st.openMonth, nil // the restore compacted every closed month
		m.hashes, m.moved, m.owned = st.hashes, st.moved, st.owned
		m.due.invalidate()
		m.changes.Add(1)
		if m.observe != nil && m.lastNow > 0 {
			m.observe(m.lastNow)
		}
	}, nil
}
