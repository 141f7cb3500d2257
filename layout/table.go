package layout

import (
	"errors"
	"fmt"
	"slices"
)

// Table is the partition → group mapping as data: Owner[p] is the group that
// owns partition p, Groups the number of groups it spreads over, and Epoch
// increases by one with every change, so that two tables of one cluster are
// ordered and a client routing by an older one can tell.
//
// Epoch 0 is the arithmetic (ArithmeticTable): what every cluster starts with
// and what a cluster that never planned a move keeps, so an upgraded cluster
// routes exactly as before. Ranges need not be contiguous: a move hands over
// one partition at a time, and the hand-off protocol (layout/handoff) works on
// any set of owned partitions.
//
// A Table is immutable once built; share it freely.
type Table struct {
	Epoch  uint64
	Groups int
	Owner  []uint16 // len = partitions
}

// ErrInvalidTable is wrapped by every Validate failure.
var ErrInvalidTable = errors.New("invalid layout table")

// MaxGroups bounds a table's group count (a group id must fit Owner's uint16).
const MaxGroups = MaxPartitions

// ArithmeticTable is the epoch-0 table of p partitions over g groups: group i
// owns GroupRange(i, p, g), as GroupOf computes.
func ArithmeticTable(p, g int) *Table {
	t := &Table{Groups: g, Owner: make([]uint16, p)}
	for i := range g {
		lo, hi := GroupRange(i, p, g)
		for q := lo; q < hi; q++ {
			t.Owner[q] = uint16(i)
		}
	}
	return t
}

// Partitions is the table's partition count.
func (t *Table) Partitions() int { return len(t.Owner) }

// GroupOf returns the group owning partition part, which must be in
// [0, Partitions()).
func (t *Table) GroupOf(part int) int { return int(t.Owner[part]) }

// Owned lists group g's partitions, ascending.
func (t *Table) Owned(g int) []int {
	var out []int
	for p, o := range t.Owner {
		if int(o) == g {
			out = append(out, p)
		}
	}
	return out
}

// Validate checks the table for a cluster of p partitions: exactly p
// entries, a group count in [1, MaxGroups], every partition owned by a group
// in [0, Groups) (each partition has exactly one owner by construction: it is
// one entry). Groups that own nothing are allowed: a new group starts empty.
func (t *Table) Validate(p int) error {
	switch {
	case t == nil:
		return fmt.Errorf("%w: missing", ErrInvalidTable)
	case len(t.Owner) != p:
		return fmt.Errorf("%w: partitions = %d, the cluster has %d", ErrInvalidTable, len(t.Owner), p)
	case t.Groups < 1 || t.Groups > MaxGroups || t.Groups > p:
		return fmt.Errorf("%w: groups = %d: must be in [1, partitions=%d]", ErrInvalidTable, t.Groups, p)
	}
	for q, o := range t.Owner {
		if int(o) >= t.Groups {
			return fmt.Errorf("%w: owner[%d] = %d: must be a group in [0, %d)", ErrInvalidTable, q, o, t.Groups)
		}
	}
	return nil
}

// Equal reports whether two tables are the same, epoch included.
func (t *Table) Equal(o *Table) bool {
	return t.Epoch == o.Epoch && t.Groups == o.Groups && slices.Equal(t.Owner, o.Owner)
}

// Move returns a copy of t with partition part owned by group to and the
// epoch one higher. part and to must be in range (see Validate).
func (t *Table) Move(part, to int) *Table {
	n := &Table{Epoch: t.Epoch + 1, Groups: max(t.Groups, to+1), Owner: slices.Clone(t.Owner)}
	n.Owner[part] = uint16(to)
	return n
}

// Run is a maximal range of consecutive partitions with one owner: the
// table's compact form on the wire and in snapshots.
type Run struct {
	First int // first partition of the run
	Group int
}

// Runs returns the table's runs, ascending by First; adjacent runs have
// different groups, so a table has exactly one run form.
func (t *Table) Runs() []Run {
	var out []Run
	for p, o := range t.Owner {
		if len(out) == 0 || out[len(out)-1].Group != int(o) {
			out = append(out, Run{First: p, Group: int(o)})
		}
	}
	return out
}

// FromRuns builds the table of p partitions from its runs (Runs' inverse)
// and validates it. The runs must start at 0, rise strictly, stay below p
// and alternate groups, so that every table has exactly one run form.
func FromRuns(epoch uint64, groups, p int, runs []Run) (*Table, error) {
	if p < 1 || p > MaxPartitions {
		return nil, fmt.Errorf("%w: partitions = %d: must be in [1, %d]", ErrInvalidTable, p, MaxPartitions)
	}
	if len(runs) == 0 || runs[0].First != 0 {
		return nil, fmt.Errorf("%w: runs must start at partition 0", ErrInvalidTable)
	}
	t := &Table{Epoch: epoch, Groups: groups, Owner: make([]uint16, p)}
	for i, r := range runs {
		end := p
		if i+1 < len(runs) {
			end = runs[i+1].First
		}
		switch {
		case end <= r.First || end > p:
			return nil, fmt.Errorf("%w: run %d starts at %d, the next at %d: runs must rise strictly within [0, %d)", ErrInvalidTable, i, r.First, end, p)
		case r.Group < 0 || r.Group >= groups:
			return nil, fmt.Errorf("%w: run %d: group %d: must be in [0, groups=%d)", ErrInvalidTable, i, r.Group, groups)
		case i > 0 && runs[i-1].Group == r.Group:
			return nil, fmt.Errorf("%w: runs %d and %d both name group %d: adjacent runs must differ", ErrInvalidTable, i-1, i, r.Group)
		}
		for q := r.First; q < end; q++ {
			t.Owner[q] = uint16(r.Group)
		}
	}
	if err := t.Validate(p); err != nil {
		return nil, err
	}
	return t, nil
}
