package layouttable

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/layout"
)

const (
	testP = 64
	testG = 4
)

type group struct {
	f       *fsm.FSM
	m       *Module
	idx     uint64
	changes []*layout.Table
}

func newGroup(t testing.TB, maxVersion int) *group {
	t.Helper()
	g := &group{}
	g.m = New(testP, testG, func(tab *layout.Table) { g.changes = append(g.changes, tab) })
	f, err := fsm.New(fsm.Config{Partitions: testP, Groups: testG, Shards: 4, Group: 0, Modules: []fsm.Module{g.m}, MaxClusterVersion: maxVersion})
	if err != nil {
		t.Fatal(err)
	}
	g.f = f
	return g
}

// apply runs a layout-set entry through the FSM, as raft delivers it.
func (g *group) apply(t testing.TB, s Set) any {
	t.Helper()
	data, err := fsm.AppendModuleEntry(nil, EntrySet, 100, AppendSet(nil, s))
	if err != nil {
		t.Fatal(err)
	}
	g.idx++
	return g.f.Apply(&raft.Log{Index: g.idx, Term: 1, Type: raft.LogCommand, Data: data})
}

func snap(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Persist(&sink{Buffer: &buf}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type sink struct{ *bytes.Buffer }

func (sink) ID() string    { return "test" }
func (sink) Cancel() error { return nil }
func (sink) Close() error  { return nil }

// Before any entry the module answers the arithmetic; a set installs the new
// table (compare-and-set on the epoch), and stale or skipping epochs are
// refused in the response without changing anything.
func TestSetCompareAndSet(t *testing.T) {
	g := newGroup(t, 0)
	if cur := g.m.Current(); cur.Epoch != 0 || !cur.Equal(layout.ArithmeticTable(testP, testG)) {
		t.Fatalf("initial table %+v, want the arithmetic", cur)
	}
	moved := g.m.Current().Move(31, 2)
	res, ok := g.apply(t, Set{Expected: 0, Table: moved}).(SetResult)
	if !ok || res.Refused != "" || res.Epoch != 1 {
		t.Fatalf("first set: %#v", res)
	}
	if cur := g.m.Current(); !cur.Equal(moved) || cur.GroupOf(31) != 2 {
		t.Fatalf("table after set: %+v", cur)
	}
	if len(g.changes) != 1 || !g.changes[0].Equal(moved) {
		t.Fatalf("onChange saw %d changes", len(g.changes))
	}
	for name, s := range map[string]Set{
		"stale expected": {Expected: 0, Table: moved.Move(0, 1)},
		"skipped epoch":  {Expected: 1, Table: moved.Move(0, 1).Move(1, 1)},
		"same epoch":     {Expected: 1, Table: moved},
		"other P":        {Expected: 1, Table: layout.ArithmeticTable(32, 4).Move(0, 1)},
		"more groups":    {Expected: 1, Table: moved.Move(0, testG)},
	} {
		res, ok := g.apply(t, s).(SetResult)
		if !ok || res.Refused == "" || res.Epoch != 1 {
			t.Errorf("%s: %#v, want a refusal at epoch 1", name, res)
		}
	}
	if !g.m.Current().Equal(moved) || len(g.changes) != 1 {
		t.Fatal("a refused set changed the table")
	}
}

// An unset module writes no section, so upgraded clusters' snapshots do not
// change; a set table survives snapshot and restore byte for byte; a
// snapshot without the section restores the arithmetic.
func TestSnapshotRoundTrip(t *testing.T) {
	a := newGroup(t, 0)
	old := snap(t, a.f)
	if sum, err := snapfmt.Inspect(bytes.NewReader(old)); err != nil || len(sum.Sections) != 0 {
		t.Fatalf("unset module: sections %+v %v", sum, err)
	}
	moved := a.m.Current().Move(31, 2).Move(5, 3)
	moved.Epoch = 1
	if res := a.apply(t, Set{Expected: 0, Table: moved}).(SetResult); res.Refused != "" {
		t.Fatal(res.Refused)
	}
	b1 := snap(t, a.f)
	sum, err := snapfmt.Inspect(bytes.NewReader(b1))
	if err != nil || len(sum.Sections) != 1 || sum.Sections[0].Name != Name {
		t.Fatalf("sections %+v %v", sum, err)
	}
	b := newGroup(t, 0)
	if err := b.f.Restore(io.NopCloser(bytes.NewReader(b1))); err != nil {
		t.Fatal(err)
	}
	if !b.m.Current().Equal(moved) || len(b.changes) != 1 {
		t.Fatalf("restored %+v, want %+v", b.m.Current(), moved)
	}
	if !bytes.Equal(snap(t, b.f), b1) {
		t.Fatal("snapshot of the restored state differs")
	}
	if err := b.f.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if cur := b.m.Current(); cur.Epoch != 0 || !cur.Equal(layout.ArithmeticTable(testP, testG)) {
		t.Fatalf("after a snapshot without the section: %+v", cur)
	}
}

// Every truncation and every single-bit flip of a section is refused as
// corrupt, or decodes to a valid table of this cluster (a flip in the epoch
// or a group id can be a valid table too: the FSM's checksum catches those).
// A section of another partition count is refused. A refused restore
// changes nothing.
func TestCorruptSectionDetected(t *testing.T) {
	a := newGroup(t, 0)
	moved := a.m.Current().Move(31, 2)
	a.apply(t, Set{Expected: 0, Table: moved})
	fn, err := a.m.Snapshot()
	if err != nil || fn == nil {
		t.Fatalf("snapshot: no section (%v)", err)
	}
	raw, _ := fn()
	for n := range len(raw) {
		if _, err := a.m.PrepareRestore(raw[:n]); !errors.Is(err, ErrBadPayload) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	if _, err := a.m.PrepareRestore(append(append([]byte(nil), raw...), 0)); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("trailing byte: %v", err)
	}
	refused := 0
	for i := range len(raw) * 8 {
		b := append([]byte(nil), raw...)
		b[i/8] ^= 1 << (i % 8)
		commit, err := a.m.PrepareRestore(b)
		if err != nil {
			if !errors.Is(err, ErrBadPayload) {
				t.Fatalf("bit %d: %v, want ErrBadPayload", i, err)
			}
			refused++
			continue
		}
		if commit == nil {
			t.Fatalf("bit %d: no error and no commit", i)
		}
	}
	if refused == 0 {
		t.Fatal("no bit flip refused")
	}
	if !a.m.Current().Equal(moved) {
		t.Fatal("a refused restore changed the table")
	}
	if _, err := New(32, 4, nil).PrepareRestore(raw); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("section of 64 partitions into a module of 32: %v", err)
	}
	// A cluster created with 2 groups may have been raised to 4: the table
	// restores.
	if _, err := New(testP, 2, nil).PrepareRestore(raw); err != nil {
		t.Fatalf("section over 4 groups into a module created with 2: %v", err)
	}
}

// A layout-set entry that does not decode halts the group (as any corrupt
// entry); well-formed encodings of invalid tables are refused by the decoder.
func TestBadPayloads(t *testing.T) {
	good := AppendSet(nil, Set{Expected: 0, Table: layout.ArithmeticTable(testP, testG).Move(3, 1)})
	if s, err := DecodeSet(good); err != nil || s.Table.GroupOf(3) != 1 || s.Table.Epoch != 1 {
		t.Fatalf("%+v %v", s, err)
	}
	enc := func(parts ...uint64) []byte {
		var b []byte
		for _, v := range parts {
			b = append(b, byte(v)) // all values below 128: one-byte uvarints
		}
		return b
	}
	bad := map[string][]byte{
		"empty":          nil,
		"truncated":      good[:len(good)-1],
		"trailing":       append(append([]byte(nil), good...), 0),
		"zero groups":    enc(0, 1, 64, 0, 1, 0, 0),
		"groups > P":     enc(0, 1, 4, 5, 1, 0, 0),
		"no runs":        enc(0, 1, 64, 4, 0),
		"first not 0":    enc(0, 1, 64, 4, 1, 1, 0),
		"run group high": enc(0, 1, 64, 4, 1, 0, 4),
		"runs not risng": enc(0, 1, 64, 4, 2, 0, 0, 0, 1),
		"same adjacent":  enc(0, 1, 64, 4, 2, 0, 0, 8, 0),
		"run past P":     enc(0, 1, 64, 4, 2, 0, 0, 64, 1),
	}
	for name, b := range bad {
		if _, err := DecodeSet(b); !errors.Is(err, ErrBadPayload) {
			t.Errorf("%s: DecodeSet = %v, want ErrBadPayload", name, err)
		}
	}
	g := newGroup(t, 0)
	data, _ := fsm.AppendModuleEntry(nil, EntrySet, 1, bad["truncated"])
	res := g.f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); !ok || !errors.Is(err, fsm.ErrHalted) {
		t.Fatalf("bad payload response %v, want the group halted", res)
	}
}

// The entry type needs cluster version 5: a replica that supports only 4
// halts on it rather than skip it (the leader's version gate keeps it from
// being proposed to such a group).
func TestEntryNeedsClusterVersion5(t *testing.T) {
	info, ok := fsm.LookupEntryType(EntrySet)
	if !ok || info.Since != 5 || info.Module != Name || fsm.CurrentClusterVersion < 5 {
		t.Fatalf("type %d: %+v (current cluster version %d)", EntrySet, info, fsm.CurrentClusterVersion)
	}
	g := newGroup(t, 4)
	res := g.apply(t, Set{Expected: 0, Table: g.m.Current().Move(1, 2)})
	if err, ok := res.(error); !ok || !errors.Is(err, fsm.ErrHalted) {
		t.Fatalf("applied on a version-4 replica: %v, want the group halted", res)
	}
	if g.m.Current().Epoch != 0 {
		t.Fatal("a version-4 replica changed its table")
	}
}
