package layouttable

import (
	"fmt"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// Name is the module's name: its registry row and its snapshot section.
const Name = "layout"

// EntrySet replaces the table (compare-and-set on the epoch).
const EntrySet byte = 21

// ClusterVersion is the cluster version that introduced EntrySet.
const ClusterVersion = 5

func init() {
	fsm.RegisterModuleEntry(Name, EntrySet, "layout-set", ClusterVersion)
}

// SetResult is a layout-set entry's response.
type SetResult struct {
	Epoch   uint64 // the epoch in force after the entry
	Refused string // non-empty: nothing changed, and why
}

// Module is group 0's replica of the layout table.
type Module struct {
	partitions int
	groups     int
	arith      *layout.Table
	cur        atomic.Pointer[layout.Table] // nil: never set, the arithmetic is in force
	onChange   func(*layout.Table)
}

// New returns the module of a cluster of p partitions over g groups (p and g
// already validated, layout.ValidateLayout). onChange, if not nil, is called
// on the apply goroutine after every change of the table (a set, a restore).
func New(p, g int, onChange func(*layout.Table)) *Module {
	return &Module{partitions: p, groups: g, arith: layout.ArithmeticTable(p, g), onChange: onChange}
}

// NewRaised is New for a node running g groups in a cluster whose layout was
// created with base of them (base ≤ g): until a table is set, the
// arithmetic of base groups is in force and the groups above own nothing
// (layout.GroupSpan); tables of up to g groups are accepted.
func NewRaised(p, base, g int, onChange func(*layout.Table)) (*Module, error) {
	if base < 1 || base > g {
		return nil, fmt.Errorf("layout table: base group count %d outside [1, groups=%d]", base, g)
	}
	arith, _, err := layout.ArithmeticTable(p, base).Raise(g)
	if err != nil {
		return nil, fmt.Errorf("layout table: %w", err)
	}
	arith.Epoch = 0 // still the arithmetic: no table was set
	return &Module{partitions: p, groups: g, arith: arith, onChange: onChange}, nil
}

// Current is the table in force: the last one set, else the arithmetic. Safe
// from any goroutine; the table must not be modified.
func (m *Module) Current() *layout.Table {
	if t := m.cur.Load(); t != nil {
		return t
	}
	return m.arith
}

// Name implements fsm.Module.
func (m *Module) Name() string { return Name }

// Apply implements fsm.Module. A table for another partition count or more
// groups than the cluster runs, or one
// whose epoch does not follow the current one by exactly one, is refused in
// the response (a leader proposing from a stale read; every replica refuses
// it alike). An undecodable payload is an error: the group halts.
func (m *Module) Apply(e fsm.ModuleEntry) (any, error) {
	if e.Type != EntrySet {
		return nil, fmt.Errorf("layout module: entry type %d is not %d", e.Type, EntrySet)
	}
	s, err := DecodeSet(e.Payload)
	if err != nil {
		return nil, err
	}
	cur := m.Current()
	switch {
	case s.Table.Partitions() != m.partitions:
		return SetResult{Epoch: cur.Epoch, Refused: fmt.Sprintf("table of %d partitions, the cluster has %d", s.Table.Partitions(), m.partitions)}, nil
	case s.Table.Groups > m.groups:
		// Until groups can be created on a running node, a table may only
		// use the groups every node runs.
		return SetResult{Epoch: cur.Epoch, Refused: fmt.Sprintf("table of %d groups, the cluster runs %d", s.Table.Groups, m.groups)}, nil
	case s.Expected != cur.Epoch:
		return SetResult{Epoch: cur.Epoch, Refused: fmt.Sprintf("expected epoch %d, the table is at %d", s.Expected, cur.Epoch)}, nil
	case s.Table.Epoch != cur.Epoch+1:
		return SetResult{Epoch: cur.Epoch, Refused: fmt.Sprintf("new epoch %d: must be %d", s.Table.Epoch, cur.Epoch+1)}, nil
	}
	m.install(s.Table)
	return SetResult{Epoch: s.Table.Epoch}, nil
}

func (m *Module) install(t *layout.Table) {
	m.cur.Store(t)
	if m.onChange != nil {
		m.onChange(m.Current())
	}
}

// Snapshot implements fsm.Module: no section while the arithmetic is in
// force.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	t := m.cur.Load()
	if t == nil {
		return nil, nil
	}
	return func() ([]byte, error) {
		w := wire.Encoder{Buf: []byte{sectionVersion}}
		appendTable(&w, t)
		return w.Buf, nil
	}, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	var t *layout.Table
	if data != nil {
		d := wire.NewDecoder(data, ErrBadPayload)
		if v := d.Byte("section version"); d.Err() == nil && v != sectionVersion {
			d.Failf("section version %d, this build reads %d", v, sectionVersion)
		}
		t = readTable(&d)
		if err := d.Finish(); err != nil {
			return nil, err
		}
		if t.Partitions() != m.partitions || t.Groups > m.groups {
			return nil, fmt.Errorf("%w: table of %d partitions over %d groups restored into a cluster of %d over %d",
				ErrBadPayload, t.Partitions(), t.Groups, m.partitions, m.groups)
		}
	}
	return func() { m.install(t) }, nil
}
