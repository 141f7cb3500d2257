package metering

import (
	"fmt"
	"math"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// Moving one partition's metering to another group (docs/online-groups.md,
// "The hand-off of metering"). The partition-moves module calls TakePartition
// in the giver's apply of a give and PutPartition in the receiver's apply of
// the receive, so both run at one index on every replica.
//
// What moves: the spans of the partition's targets (open ones, and stopped
// ones with intervals still to sample) and the dedup records of their
// events. The ledger, the dead letters and the active-series samples stay:
// they are history or per tenant, and queries read every group.
//
// Usage ids: a moved span keeps naming the group and span that started it
// (Span.OriginGroup, OriginSpan), so an interval the giver posted and did not
// record is posted again under the same idempotency key. The receiver gives
// the span a new id of its own (span ids are per group).
//
// Dedup records: those created after the switch (meter-targets) carry their
// target's hash, so the give takes exactly the partition's. Those created
// before are unknown on every replica alike; the give copies all of them
// (the giver keeps them too: they may be other partitions'), so a retry of
// any event the giver accepted finds its id in the receiver.
//
// The fence: from the give on, the giver answers Moved to every event of the
// partition (before the dedup check: its ids left with it), in the apply, so
// every replica agrees whatever its leader did; a receive of the partition
// lifts it.
//
// Transfer payload (fsm/wire fields):
//
//	byte     1 (payload version)
//	uvarint  partitions P, uvarint partition p (< P)
//	byte     held: 1 if the giver held the partition's metering, 0 if not
//	         (no span or record follows, and the receiver does not start
//	         holding it: its metering is still where a series-only move
//	         left it)
//	varint   the giver's now (ms)
//	uvarint  span count, spans as in the section at version 2 (the
//	         giver's id; origin always set), rising by the giver's id
//	uvarint  dedup count, records as in the section at version 2, in
//	         (kind, id) order
//
// Targets payload (meter-targets, 28): empty.

const transferVersion = 1

// maxPartitions bounds P in a payload or section (layout allows fewer).
const maxPartitions = 1 << 16

// EncodeTargets encodes a meter-targets payload (empty).
func EncodeTargets() []byte { return []byte{} }

// DecodeTargets checks a meter-targets payload.
func DecodeTargets(b []byte) error {
	d := wire.NewDecoder(b, ErrBadPayload)
	return d.Finish()
}

// Hashes reports whether the switch applied here: dedup records keep their
// target's hash.
func (m *Module) Hashes() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.hashes
}

// SetHome configures the partitions whose metering the group holds until a
// move: [lo, hi) of p, the range the created count's arithmetic gives it
// (layout.GroupSpan; empty for a group a raise added, which holds none until
// it receives one). Call it before the first entry applies. Without it the
// module holds every target routed to it, and cannot move any.
func (m *Module) SetHome(p, lo, hi int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.partitions, m.homeLo, m.homeHi = p, lo, hi
}

// owns reports whether the group holds partition p's metering. Under mu.
func (m *Module) owns(p int) bool {
	if m.moved {
		return m.owned[p]
	}
	return p >= m.homeLo && p < m.homeHi
}

// fenced reports whether an event of target hash th is another group's:
// its partition's metering was given away, or the group is one a raise
// added and never received it. A group of the created count that never
// moved anything takes every event routed to it, as builds before moves
// did (routing sends it only its own). Under mu.
func (m *Module) fenced(th uint64) (int, bool) {
	if m.partitions == 0 {
		return 0, false
	}
	p := layout.Partition(th, m.partitions)
	return p, (m.moved || m.homeLo == m.homeHi) && !m.owns(p)
}

// Owns reports whether the group holds partition p's metering now.
func (m *Module) Owns(p int) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.partitions > 0 && p >= 0 && p < m.partitions && m.owns(p)
}

// startMoves makes the held partitions explicit (replicated from here on).
func (m *Module) startMoves() {
	if m.moved {
		return
	}
	m.owned = make([]bool, m.partitions)
	for p := m.homeLo; p < m.homeHi; p++ {
		m.owned[p] = true
	}
	m.moved = true
}

// TakeResult says what a take moved.
type TakeResult struct {
	Spans, Dedup int
}

// TakePartition removes partition p's metering from the group and returns
// it as a transfer payload; from here on the
// partition's events are answered Moved. It runs on the apply goroutine of
// the give. A partition whose metering is not here (given away, or left in
// its first group by a build that moved series only) gives an empty
// transfer, which moves nothing.
func (m *Module) TakePartition(p int) ([]byte, TakeResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	partitions := m.partitions
	if p < 0 || p >= partitions {
		return nil, TakeResult{}, fmt.Errorf("%w: partition %d of group %d's %d (SetHome)", ErrBadPayload, p, m.group, partitions)
	}
	defer m.changes.Add(1)
	e := wire.Encoder{}
	e.Byte(transferVersion)
	e.Uvarint(uint64(partitions))
	e.Uvarint(uint64(p))
	held := m.owns(p)
	e.Bool(held)
	e.Varint(m.lastNow)
	var res TakeResult
	if held {
		var ids []uint64
		for id, s := range m.spans {
			if layout.Partition(TargetHash(s.Target), partitions) == p {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		e.Uvarint(uint64(len(ids)))
		for _, id := range ids {
			s := m.spans[id]
			c := *s
			if c.OriginSpan == 0 {
				c.OriginGroup, c.OriginSpan = m.group, s.ID
			}
			appendSpan(&e, &c, true)
			if !s.Stopped {
				delete(m.open, s.Target.key())
			}
			delete(m.spans, id)
		}
		res.Spans = len(ids)
		var keys []dedupKey
		for k, d := range m.dedup {
			if !d.known || layout.Partition(d.th, partitions) == p {
				keys = append(keys, k)
			}
		}
		sortDedup(keys)
		e.Uvarint(uint64(len(keys)))
		for _, k := range keys {
			d := m.dedup[k]
			appendDedup(&e, k, d, true)
			if d.known {
				delete(m.dedup, k) // unknown ones may be other partitions': kept
			}
		}
		res.Dedup = len(keys)
	} else {
		e.Uvarint(0)
		e.Uvarint(0)
	}
	m.startMoves()
	m.owned[p] = false
	m.due.invalidate()
	return e.Buf, res, nil
}

// Transfer is a decoded take.
type Transfer struct {
	Partitions, Partition int
	Held                  bool // the giver held the partition's metering
	Now                   int64
	Spans                 []*Span
	Dedup                 map[dedupKey]dedupRec
}

// DecodeTransfer validates a transfer payload without installing it.
func DecodeTransfer(b []byte) (*Transfer, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	if v := d.Byte("transfer version"); d.Err() == nil && v != transferVersion {
		d.Failf("metering transfer version %d (this build reads %d)", v, transferVersion)
	}
	t := &Transfer{Dedup: map[dedupKey]dedupRec{}}
	t.Partitions = int(d.Uvarint("partitions") & math.MaxInt32)
	t.Partition = int(d.Uvarint("partition") & math.MaxInt32)
	if d.Err() == nil && (t.Partitions < 1 || t.Partitions > maxPartitions || t.Partition >= t.Partitions) {
		d.Failf("partition %d of %d", t.Partition, t.Partitions)
	}
	t.Held = d.Bool("held")
	t.Now = d.Varint("now")
	n := d.Count("span count", len(b))
	if d.Err() == nil && !t.Held && n != 0 {
		d.Failf("%d spans in a transfer of metering the giver did not hold", n)
	}
	open := map[string]bool{}
	var last uint64
	for range n {
		if d.Err() != nil {
			break
		}
		s := readSpan(&d, true)
		switch {
		case d.Err() != nil:
		case s.ID <= last || s.OriginSpan == 0:
			d.Failf("span %d out of order or without its origin", s.ID)
		case layout.Partition(TargetHash(s.Target), t.Partitions) != t.Partition:
			d.Failf("span %d is not of partition %d", s.ID, t.Partition)
		case !s.Stopped && open[s.Target.key()]:
			d.Failf("two open spans for one target")
		}
		if d.Err() != nil {
			break
		}
		last = s.ID
		if !s.Stopped {
			open[s.Target.key()] = true
		}
		t.Spans = append(t.Spans, s)
	}
	n = d.Count("dedup count", len(b))
	if d.Err() == nil && !t.Held && n != 0 {
		d.Failf("%d dedup records in a transfer of metering the giver did not hold", n)
	}
	for range n {
		if d.Err() != nil {
			break
		}
		k, r := readDedup(&d, true)
		if d.Err() == nil {
			if _, dup := t.Dedup[k]; dup {
				d.Failf("dedup id %q twice", k.id)
				break
			}
			t.Dedup[k] = r
		}
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	return t, nil
}

// PutResult says what a put installed.
type PutResult struct {
	Spans, Dedup int
	Refused      string // non-empty: nothing changed, and why
}

// PutPartition installs a transfer (DecodeTransfer's) in the receiver (one
// whose giver did not hold the metering changes nothing but the now): each
// span under a new id of this group, keeping its origin; each dedup record
// unless this group has the id already (the later expiry is kept); the
// partition's fence lifted. A transfer whose open span's target is open here
// too is refused whole (a group never holds a partition it has not received).
// It runs on the apply goroutine of the receive.
func (m *Module) PutPartition(t *Transfer) PutResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.changes.Add(1)
	if m.partitions != t.Partitions {
		return PutResult{Refused: fmt.Sprintf("transfer of %d partitions into group %d of a cluster of %d", t.Partitions, m.group, m.partitions)}
	}
	for _, s := range t.Spans {
		if _, ok := m.open[s.Target.key()]; ok && !s.Stopped {
			return PutResult{Refused: fmt.Sprintf("span %d of group %d: its target has an open span here", s.OriginSpan, s.OriginGroup)}
		}
	}
	m.tick(t.Now)
	for _, in := range t.Spans {
		s := *in
		s.ID = m.nextSpan
		m.nextSpan++
		m.spans[s.ID] = &s
		if !s.Stopped {
			m.open[s.Target.key()] = s.ID
		}
	}
	for k, r := range t.Dedup {
		if have, ok := m.dedup[k]; ok {
			if r.expires > have.expires {
				have.expires = r.expires
				m.dedup[k] = have
			}
			continue
		}
		m.dedup[k] = r
	}
	if t.Held {
		m.startMoves()
		m.owned[t.Partition] = true
	}
	m.due.invalidate()
	return PutResult{Spans: len(t.Spans), Dedup: len(t.Dedup)}
}

// TakeMetering is TakePartition for the partition-moves module's Metering.
func (m *Module) TakeMetering(p int) ([]byte, error) {
	b, _, err := m.TakePartition(p)
	return b, err
}

// PrepareMetering validates a transfer; install puts it (the partition-moves
// module's Metering).
func (m *Module) PrepareMetering(b []byte) (func() string, error) {
	t, err := DecodeTransfer(b)
	if err != nil {
		return nil, err
	}
	return func() string { return m.PutPartition(t).Refused }, nil
}
