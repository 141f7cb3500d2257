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

// EntryRaise raises the group count: the same owners, more groups (empty),
// the epoch one higher (layout.Table.Raise). Its payload is the new count,
// one uvarint.
const EntryRaise byte = 22

// RaiseClusterVersion is the cluster version that introduced EntryRaise:
// replicas of older builds refuse any table over more groups than they run,
// so a raise waits until every server runs a build that creates groups.
const RaiseClusterVersion = 6

func init() {
	fsm.RegisterModuleEntry(Name, EntrySet, "layout-set", ClusterVersion)
	fsm.RegisterModuleEntry(Name, EntryRaise, "layout-raise", RaiseClusterVersion)
}

// SetResult is a layout-set entry's response.
type SetResult struct {
	Epoch   uint64 // the epoch in force after the entry
	Refused string // non-empty: nothing changed, and why
}

// Module is group 0's replica of the layout table.
type Module struct {
	partitions int
	arith      *layout.Table
	cur        atomic.Pointer[layout.Table] // nil: never set, the arithmetic is in force
	onChange   func(*layout.Table)
	onRaise    func(RaiseApplied) // SetOnRaise
}

// New returns the module of a cluster of p partitions created with g groups
// (p and g already validated, layout.ValidateLayout): the arithmetic of g
// groups is in force until a table is set or the count raised. onChange, if not nil, is called
// on the apply goroutine after every change of the table (a set, a restore).
func New(p, g int, onChange func(*layout.Table)) *Module {
	return &Module{partitions: p, arith: layout.ArithmeticTable(p, g), onChange: onChange}
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
	if e.Type == EntryRaise {
		return m.applyRaise(e.Payload)
	}
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
	case s.Table.Groups > cur.Groups:
		// A set may only use the groups the cluster runs: cur.Groups is
		// replicated state (the count the cluster was created with, raised
		// only by layout-raise, which creates the groups), so every replica
		// decides alike whatever count its node started with.
		return SetResult{Epoch: cur.Epoch, Refused: fmt.Sprintf("table of %d groups, the cluster runs %d", s.Table.Groups, cur.Groups)}, nil
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
		if t.Partitions() != m.partitions {
			return nil, fmt.Errorf("%w: table of %d partitions over %d groups restored into a cluster of %d partitions",
				ErrBadPayload, t.Partitions(), t.Groups, m.partitions)
		}
	}
	return func() { m.install(t) }, nil
}
