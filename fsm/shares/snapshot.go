package shares

import (
	"maps"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Snapshot section "shares", format version 1 (the FSM frames and checksums
// it; snapfmt v2). uvarint unless noted, tenants in byte order, transfers by
// seq, givers by group:
//
//	1 byte   section version (1)
//	uvarint  groups, group (must match the restoring module)
//	uvarint  fallback seq counter (entries applied without raft; 0 in a cluster)
//	uvarint  tenant count T
//	T ×      uvarint len, tenant id; varint delta (zig-zag); given; received; moves;
//	         uvarint O, O × (seq, to, amount)   outstanding transfers
//	         uvarint I, I × (from, seq)         highest seq received per giver
//
// The section and the entry payloads (AppendGive, AppendReceive,
// AppendComplete) are fsm/wire fields: varints in their minimal form only.
// Builds before fsm/wire also accepted padded varints, which no encoder ever
// wrote; a payload or section holding one is now refused.
//
// Snapshots written before this module existed have no section: every delta
// is 0 (each group's share is its base), which is exactly the state of a
// cluster that never moved headroom. Leader-local reservations are not part
// of the state and are not written.
const sectionVersion = 1

type snapTenant struct {
	name                          string
	delta, given, received, moves int64
	out                           []Transfer
	in                            [][2]uint64
}

// Snapshot implements fsm.Module.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.tenants) == 0 && m.seq == 0 {
		return nil, nil
	}
	ts := make([]snapTenant, 0, len(m.tenants))
	for _, name := range slices.Sorted(maps.Keys(m.tenants)) {
		t := m.tenants[name]
		st := snapTenant{name: name, delta: t.delta, given: t.given, received: t.received, moves: t.moves}
		for _, seq := range slices.Sorted(maps.Keys(t.out)) {
			st.out = append(st.out, t.out[seq])
		}
		for _, from := range slices.Sorted(maps.Keys(t.lastIn)) {
			st.in = append(st.in, [2]uint64{uint64(from), t.lastIn[from]})
		}
		ts = append(ts, st)
	}
	groups, group, seq := m.groups, m.group, m.seq
	return func() ([]byte, error) {
		w := wire.Encoder{Buf: []byte{sectionVersion}}
		w.Uvarint(uint64(groups))
		w.Uvarint(uint64(group))
		w.Uvarint(seq)
		w.Uvarint(uint64(len(ts)))
		for _, t := range ts {
			w.String(t.name)
			w.Varint(t.delta)
			w.Uvarint(uint64(t.given))
			w.Uvarint(uint64(t.received))
			w.Uvarint(uint64(t.moves))
			w.Uvarint(uint64(len(t.out)))
			for _, o := range t.out {
				w.Uvarint(o.Seq)
				w.Uvarint(uint64(o.To))
				w.Uvarint(uint64(o.Amount))
			}
			w.Uvarint(uint64(len(t.in)))
			for _, in := range t.in {
				w.Uvarint(in[0])
				w.Uvarint(in[1])
			}
		}
		return w.Buf, nil
	}, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	tenants := map[string]*tenant{}
	var seq uint64
	if data != nil {
		d := wire.NewDecoder(data, ErrBadPayload)
		if v := d.Byte("section version"); d.Err() == nil && v != sectionVersion {
			d.Failf("section version %d, this build reads %d", v, sectionVersion)
		}
		if gs, g := d.Uvarint("groups"), d.Uvarint("group"); d.Err() == nil && (gs != uint64(m.groups) || g != uint64(m.group)) {
			d.Failf("section of group %d of %d restored into group %d of %d", g, gs, m.group, m.groups)
		}
		seq = d.Uvarint("seq counter")
		// Counts bound no allocation here; Count still refuses one beyond
		// the bytes left.
		n := d.Count("tenant count", len(data))
		for i := 0; i < n && d.Err() == nil; i++ {
			name := readTenant(&d)
			t := &tenant{out: map[uint64]Transfer{}, lastIn: map[int]uint64{}}
			t.delta = d.Varint("delta")
			t.given = int64(d.Uvarint("given"))
			t.received = int64(d.Uvarint("received"))
			t.moves = int64(d.Uvarint("moves"))
			no := d.Count("outstanding count", len(data))
			for j := 0; j < no && d.Err() == nil; j++ {
				s := d.Uvarint("seq")
				to := readGroup(&d, "to")
				a := readAmount(&d)
				t.out[s] = Transfer{Tenant: name, Seq: s, To: to, Amount: a}
			}
			ni := d.Count("received count", len(data))
			for j := 0; j < ni && d.Err() == nil; j++ {
				from := readGroup(&d, "from")
				t.lastIn[from] = d.Uvarint("seq")
			}
			if d.Err() == nil {
				if _, dup := tenants[name]; dup {
					d.Failf("tenant %q twice", name)
				}
				tenants[name] = t
			}
		}
		if err := d.Finish(); err != nil {
			return nil, err
		}
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.tenants, m.seq = tenants, seq
		clear(m.res)
		clear(m.resSum)
	}, nil
}
