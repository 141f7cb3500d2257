package shares

import (
	"encoding/binary"
	"maps"
	"slices"
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
		b := []byte{sectionVersion}
		b = binary.AppendUvarint(b, uint64(groups))
		b = binary.AppendUvarint(b, uint64(group))
		b = binary.AppendUvarint(b, seq)
		b = binary.AppendUvarint(b, uint64(len(ts)))
		for _, t := range ts {
			b = appendString(b, t.name)
			b = binary.AppendVarint(b, t.delta)
			b = binary.AppendUvarint(b, uint64(t.given))
			b = binary.AppendUvarint(b, uint64(t.received))
			b = binary.AppendUvarint(b, uint64(t.moves))
			b = binary.AppendUvarint(b, uint64(len(t.out)))
			for _, o := range t.out {
				b = binary.AppendUvarint(b, o.Seq)
				b = binary.AppendUvarint(b, uint64(o.To))
				b = binary.AppendUvarint(b, uint64(o.Amount))
			}
			b = binary.AppendUvarint(b, uint64(len(t.in)))
			for _, in := range t.in {
				b = binary.AppendUvarint(b, in[0])
				b = binary.AppendUvarint(b, in[1])
			}
		}
		return b, nil
	}, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	tenants := map[string]*tenant{}
	var seq uint64
	if data != nil {
		if len(data) == 0 || data[0] != sectionVersion {
			return nil, errorf("section version %v, this build reads %d", firstByte(data), sectionVersion)
		}
		d := dec{b: data[1:]}
		if gs, g := d.uvarint("groups"), d.uvarint("group"); d.err == nil && (int(gs) != m.groups || int(g) != m.group) {
			d.fail("section of group %d of %d restored into group %d of %d", g, gs, m.group, m.groups)
		}
		seq = d.uvarint("seq counter")
		n := d.uvarint("tenant count")
		for i := uint64(0); i < n && d.err == nil; i++ {
			name := d.str()
			t := &tenant{out: map[uint64]Transfer{}, lastIn: map[int]uint64{}}
			t.delta = d.varint("delta")
			t.given = int64(d.uvarint("given"))
			t.received = int64(d.uvarint("received"))
			t.moves = int64(d.uvarint("moves"))
			no := d.uvarint("outstanding count")
			for j := uint64(0); j < no && d.err == nil; j++ {
				s := d.uvarint("seq")
				to := d.group("to")
				a := d.amount()
				t.out[s] = Transfer{Tenant: name, Seq: s, To: to, Amount: a}
			}
			ni := d.uvarint("received count")
			for j := uint64(0); j < ni && d.err == nil; j++ {
				from := d.group("from")
				t.lastIn[from] = d.uvarint("seq")
			}
			if d.err == nil {
				if _, dup := tenants[name]; dup {
					d.fail("tenant %q twice", name)
				}
				tenants[name] = t
			}
		}
		if err := d.end(); err != nil {
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

func (d *dec) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func firstByte(b []byte) any {
	if len(b) == 0 {
		return "none"
	}
	return b[0]
}
