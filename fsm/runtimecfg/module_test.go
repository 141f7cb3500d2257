package runtimecfg

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
)

func newFSM(t *testing.T) (*fsm.FSM, *Module, *[]uint64) {
	t.Helper()
	var seen []uint64
	m := New(func(d *Document) { seen = append(seen, d.Version) })
	f, err := fsm.New(fsm.Config{Partitions: 16, Groups: 2, Shards: 4, Group: 0, Modules: []fsm.Module{m}})
	if err != nil {
		t.Fatal(err)
	}
	return f, m, &seen
}

type fsmLog struct {
	f   *fsm.FSM
	idx uint64
}

func (l *fsmLog) apply(t *testing.T, typ byte, payload []byte) any {
	t.Helper()
	data, err := fsm.AppendModuleEntry(nil, typ, 100, payload)
	if err != nil {
		t.Fatal(err)
	}
	l.idx++
	return l.f.Apply(&raft.Log{Index: l.idx, Term: 1, Type: raft.LogCommand, Data: data})
}

func result(t *testing.T, v any) Result {
	t.Helper()
	r, ok := v.(Result)
	if !ok {
		t.Fatalf("response %T %v, want Result", v, v)
	}
	return r
}

// Compare-and-set: an apply against a stale version is refused and changes
// nothing; an identical apply is a no-op; patches and installs move forward.
func TestModuleEntries(t *testing.T) {
	f, m, seen := newFSM(t)
	l := &fsmLog{f: f}
	doc := mustParse(t, sampleYAML)

	r := result(t, l.apply(t, TypeApply, AppendApply(nil, Apply{Expected: 0, NewVersion: 1, Doc: doc})))
	if r.Err != nil || !r.Changed || r.Version != 1 || m.Current().Version != 1 || !SameContent(m.Current(), doc) {
		t.Fatalf("first apply: %+v", r)
	}
	// Two writers read version 1; the first wins, the second conflicts.
	other := mustParse(t, "defaults:\n  max_series: 1\n")
	r = result(t, l.apply(t, TypePatch, AppendPatch(nil, Patch{HasExpected: true, Expected: 1, Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}}})))
	if r.Err != nil || r.Version != 2 {
		t.Fatalf("patch: %+v", r)
	}
	r = result(t, l.apply(t, TypeApply, AppendApply(nil, Apply{Expected: 1, NewVersion: 2, Doc: other})))
	var ce *ConflictError
	if !errors.As(r.Err, &ce) || ce.Current != 2 || r.Changed || m.Current().For("acme", Effective{}).MaxSeries != 5 {
		t.Fatalf("stale apply: %+v", r)
	}
	// Same content again: no new version.
	r = result(t, l.apply(t, TypePatch, AppendPatch(nil, Patch{Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}}})))
	if r.Err != nil || r.Changed || r.Version != 2 {
		t.Fatalf("no-op patch: %+v", r)
	}
	// An invalid patch is a refusal every replica records alike, not a halt.
	r = result(t, l.apply(t, TypePatch, AppendPatch(nil, Patch{Target: Target{Kind: TargetDefaults}, Ops: []Op{{Kind: OpSet, Key: "ingestion_rate", Value: "-3"}}})))
	var fe *FieldError
	if !errors.As(r.Err, &fe) || fe.Field != "defaults.ingestion_rate" {
		t.Fatalf("invalid patch: %+v", r)
	}
	if h, _ := f.Halted(); h {
		t.Fatal("an invalid patch halted the group")
	}
	// Installs: newer applies, older or equal is ignored.
	newer := other.Clone()
	newer.Version = 10
	if r = result(t, l.apply(t, TypeInstall, AppendInstall(nil, newer))); !r.Changed || m.Current().Version != 10 {
		t.Fatalf("install newer: %+v", r)
	}
	older := doc.Clone()
	older.Version = 9
	if r = result(t, l.apply(t, TypeInstall, AppendInstall(nil, older))); r.Changed || !SameContent(m.Current(), other) {
		t.Fatalf("install older: %+v", r)
	}
	// Force re-asserts the same content at a higher version.
	if r = result(t, l.apply(t, TypeApply, AppendApply(nil, Apply{Expected: 10, NewVersion: 12, Force: true, Doc: other}))); !r.Changed || r.Version != 12 {
		t.Fatalf("forced apply: %+v", r)
	}
	if want := []uint64{1, 2, 10, 12}; !equal(*seen, want) {
		t.Fatalf("onChange saw %v, want %v", *seen, want)
	}

	// Snapshot → restore into a fresh FSM carries document and version.
	snap := persist(t, f)
	g, gm, _ := newFSM(t)
	if err := g.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if gm.Current().Version != 12 || !SameContent(gm.Current(), other) {
		t.Fatalf("restored version %d", gm.Current().Version)
	}
	if !bytes.Equal(persist(t, g), snap) {
		t.Fatal("snapshot of the restored FSM differs")
	}
}

// An undecodable payload halts the group (never skipped), leaving the
// document as it was.
func TestModuleCorruptPayloadHalts(t *testing.T) {
	f, m, _ := newFSM(t)
	l := &fsmLog{f: f}
	res := l.apply(t, TypeApply, []byte{0, 0, 1, 0xff})
	if err, ok := res.(error); !ok || !errors.Is(err, fsm.ErrHalted) {
		t.Fatalf("corrupt apply: %v", res)
	}
	if m.Current().Version != 0 {
		t.Fatal("document changed")
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type sink struct{ bytes.Buffer }

func (*sink) ID() string    { return "test" }
func (*sink) Cancel() error { return nil }
func (*sink) Close() error  { return nil }

func persist(t *testing.T, f *fsm.FSM) []byte {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	var out sink
	if err := s.Persist(&out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
