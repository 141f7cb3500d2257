package layouttable

import (
	"errors"
	"fmt"

	"github.com/tollgate-io/tollgate/fsm/wire"
	"github.com/tollgate-io/tollgate/layout"
)

// ErrBadPayload is wrapped by every payload or section decode failure.
var ErrBadPayload = errors.New("bad layout payload")

// Table encoding, shared by the entry payload and the snapshot section; every
// integer an fsm/wire uvarint in its minimal form:
//
//	uvarint  epoch
//	uvarint  partitions P (1..layout.MaxPartitions)
//	uvarint  groups G (1..P)
//	uvarint  run count R (1..P)
//	R ×      uvarint first partition, uvarint group   (layout.Table.Runs)
//
// The runs start at 0, rise strictly, stay below P and name alternating
// groups below G, so every table has exactly one byte form; anything else is
// refused as corrupt.
//
// layout-set payload (type 21, cluster version 5):
//
//	uvarint  expected epoch E: the epoch of the table this one replaces
//	…        the table (its epoch must be E+1)
//
// Snapshot section "layout", format version 1 (the FSM frames and checksums
// it):
//
//	1 byte   section version (1)
//	…        the table
//
// A snapshot without the section (every snapshot of a cluster that never
// applied a layout-set) restores to the arithmetic.
const sectionVersion = 1

func appendTable(w *wire.Encoder, t *layout.Table) {
	w.Uvarint(t.Epoch)
	w.Uvarint(uint64(t.Partitions()))
	w.Uvarint(uint64(t.Groups))
	runs := t.Runs()
	w.Uvarint(uint64(len(runs)))
	for _, r := range runs {
		w.Uvarint(uint64(r.First))
		w.Uvarint(uint64(r.Group))
	}
}

// readTable decodes a table; a well-formed encoding of an invalid table (runs
// out of order, a group beyond G) is a decode failure too: no encoder writes
// one.
func readTable(d *wire.Decoder) *layout.Table {
	epoch := d.Uvarint("epoch")
	p := d.Uvarint("partitions")
	g := d.Uvarint("groups")
	if d.Err() != nil {
		return nil
	}
	if p < 1 || p > layout.MaxPartitions || g < 1 || g > p {
		d.Failf("partitions %d, groups %d: want 1 ≤ groups ≤ partitions ≤ %d", p, g, layout.MaxPartitions)
		return nil
	}
	n := d.Count("run count", int(p))
	runs := make([]layout.Run, 0, n)
	for i := 0; i < n && d.Err() == nil; i++ {
		first, grp := d.Uvarint("run first"), d.Uvarint("run group")
		if first >= p || grp >= g {
			d.Failf("run %d: first %d, group %d: outside %d partitions, %d groups", i, first, grp, p, g)
			return nil
		}
		runs = append(runs, layout.Run{First: int(first), Group: int(grp)})
	}
	if d.Err() != nil {
		return nil
	}
	t, err := layout.FromRuns(epoch, int(g), int(p), runs)
	if err != nil {
		d.Failf("%v", err)
		return nil
	}
	return t
}

// Set is a layout-set entry's payload.
type Set struct {
	Expected uint64 // epoch of the table replaced
	Table    *layout.Table
}

// AppendSet encodes a layout-set payload (the entry's envelope is
// fsm.AppendModuleEntry's).
func AppendSet(dst []byte, s Set) []byte {
	w := wire.Encoder{Buf: dst}
	w.Uvarint(s.Expected)
	appendTable(&w, s.Table)
	return w.Buf
}

// DecodeSet decodes a layout-set payload.
func DecodeSet(b []byte) (Set, error) {
	d := wire.NewDecoder(b, ErrBadPayload)
	s := Set{Expected: d.Uvarint("expected epoch")}
	s.Table = readTable(&d)
	if err := d.Finish(); err != nil {
		return Set{}, fmt.Errorf("layout-set: %w", err)
	}
	return s, nil
}
