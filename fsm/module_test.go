package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// testCounterType is a registry row that exists only in this package's test
// binary: a module entry whose payload is one uvarint added to a counter.
const testCounterType byte = 250

func init() {
	RegisterModuleEntry("test-counter", testCounterType, "test-counter", 1)
}

// counter is a minimal Module: a sum and the number of adds, guarded for
// concurrent readers.
type counter struct {
	mu        sync.Mutex
	sum, adds uint64
}

func (c *counter) Name() string { return "test-counter" }

func (c *counter) Apply(e ModuleEntry) (any, error) {
	v, n := binary.Uvarint(e.Payload)
	if n <= 0 || n != len(e.Payload) {
		return nil, fmt.Errorf("counter payload of %d bytes is not one uvarint", len(e.Payload))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sum += v
	c.adds++
	return c.sum, nil
}

func (c *counter) Snapshot() (func() ([]byte, error), error) {
	c.mu.Lock()
	sum, adds := c.sum, c.adds
	c.mu.Unlock()
	if adds == 0 {
		return nil, nil
	}
	return func() ([]byte, error) {
		return binary.AppendUvarint(binary.AppendUvarint(nil, sum), adds), nil
	}, nil
}

func (c *counter) PrepareRestore(data []byte) (func(), error) {
	var sum, adds uint64
	if data != nil {
		var n, m int
		sum, n = binary.Uvarint(data)
		if n <= 0 {
			return nil, errors.New("bad sum")
		}
		adds, m = binary.Uvarint(data[n:])
		if m <= 0 || n+m != len(data) {
			return nil, errors.New("bad adds")
		}
	}
	return func() {
		c.mu.Lock()
		c.sum, c.adds = sum, adds
		c.mu.Unlock()
	}, nil
}

func (c *counter) get() (sum, adds uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum, c.adds
}

func newCounterFSM(t testing.TB) (*FSM, *counter) {
	t.Helper()
	c := &counter{}
	f, err := New(Config{Partitions: testP, Groups: testG, Shards: testS, Group: 0, Modules: []Module{c}})
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func counterEntry(t testing.TB, add uint64) []byte {
	t.Helper()
	b, err := AppendModuleEntry(nil, testCounterType, 100, binary.AppendUvarint(nil, add))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestModuleApplySnapshotRestore(t *testing.T) {
	f, c := newCounterFSM(t)
	r := rand.New(rand.NewPCG(5, 6))
	idx := uint64(0)
	for i := 1; i <= 10; i++ {
		idx++
		if res := f.Apply(&raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: counterEntry(t, uint64(i))}); res != uint64(i*(i+1)/2) {
			t.Fatalf("apply %d: response %v", i, res)
		}
		idx++
		f.Apply(&raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: AppendTrack(nil, 100, []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(r, f)}, New: 0}})})
	}
	snap := snapBytes(t, f)
	if snap[6] != 2 {
		t.Fatalf("snapshot with module state has format version %d, want 2", snap[6])
	}
	sum, err := snapfmt.Inspect(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Sections) != 1 || sum.Sections[0].Name != "test-counter" {
		t.Fatalf("sections %+v", sum.Sections)
	}

	g, gc := newCounterFSM(t)
	if err := g.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if s, a := gc.get(); s != 55 || a != 10 {
		t.Fatalf("restored counter sum %d adds %d, want 55 10", s, a)
	}
	if got, want := g.TenantActive("t"), f.TenantActive("t"); got != want || got == 0 {
		t.Fatalf("restored series %d, want %d", got, want)
	}
	if !bytes.Equal(snapBytes(t, g), snap) {
		t.Fatal("snapshot of the restored FSM differs from the original")
	}
	_ = c
}

// Without module state the snapshot stays format version 1: readable by
// builds from before modules existed (rolling upgrades).
func TestModuleWithoutStateWritesVersion1(t *testing.T) {
	f, _ := newCounterFSM(t)
	f.ApplyEntry(Entry{Type: EntryTrack, Now: 100, Tenants: []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(rand.New(rand.NewPCG(1, 1)), f)}}}})
	if v := snapBytes(t, f)[6]; v != 1 {
		t.Fatalf("format version %d, want 1", v)
	}
}

// A restore from a snapshot without the module's section resets the module.
func TestModuleRestoreWithoutSectionResets(t *testing.T) {
	empty := snapBytes(t, newTestFSM(t, 0))
	f, c := newCounterFSM(t)
	f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: counterEntry(t, 7)})
	if err := f.Restore(io.NopCloser(bytes.NewReader(empty))); err != nil {
		t.Fatal(err)
	}
	if s, a := c.get(); s != 0 || a != 0 {
		t.Fatalf("counter after restore of an empty snapshot: %d %d", s, a)
	}
}

// A snapshot holding state of a module this FSM lacks is refused, and so is a
// section the module cannot decode; neither changes anything.
func TestModuleRestoreRefusals(t *testing.T) {
	f, _ := newCounterFSM(t)
	f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: counterEntry(t, 3)})
	snap := snapBytes(t, f)

	plain := newTestFSM(t, 0)
	err := plain.Restore(io.NopCloser(bytes.NewReader(snap)))
	if !errors.Is(err, ErrSnapshotMismatch) || !strings.Contains(err.Error(), "test-counter") {
		t.Fatalf("restore into an FSM without the module: %v", err)
	}

	// A section with a valid checksum but a payload the module refuses.
	bad := rewriteSection(t, snap, "test-counter", []byte{0xff})
	g, gc := newCounterFSM(t)
	g.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: counterEntry(t, 9)})
	if err := g.Restore(io.NopCloser(bytes.NewReader(bad))); !errors.Is(err, snapfmt.ErrCorrupt) {
		t.Fatalf("restore of a bad section: %v", err)
	}
	if s, _ := gc.get(); s != 9 || g.AppliedIndex() != 1 {
		t.Fatalf("failed restore changed state: sum %d applied %d", s, g.AppliedIndex())
	}
}

// rewriteSection re-encodes snap with one section's payload replaced.
func rewriteSection(t *testing.T, snap []byte, name string, payload []byte) []byte {
	t.Helper()
	rd, err := snapfmt.NewReader(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := snapfmt.NewWriter(&buf, rd.Header())
	if err != nil {
		t.Fatal(err)
	}
	for {
		s, series, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteShard(s, series); err != nil {
			t.Fatal(err)
		}
	}
	for _, sec := range rd.Sections() {
		p := sec.Payload
		if sec.Name == name {
			p = payload
		}
		if err := w.WriteSection(sec.Name, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A module payload that does not decode halts the group like a corrupt core
// entry; so does a module entry reaching a group without that module.
func TestModuleBadPayloadHalts(t *testing.T) {
	f, c := newCounterFSM(t)
	bad, err := AppendModuleEntry(nil, testCounterType, 100, []byte{0x80})
	if err != nil {
		t.Fatal(err)
	}
	res := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: bad})
	if err, ok := res.(error); !ok || !errors.Is(err, ErrHalted) {
		t.Fatalf("bad payload: response %v", res)
	}
	if h, _ := f.Halted(); !h || f.AppliedIndex() != 0 {
		t.Fatalf("halted %v applied %d", h, f.AppliedIndex())
	}
	if s, _ := c.get(); s != 0 {
		t.Fatalf("counter changed to %d", s)
	}

	plain := newTestFSM(t, 0)
	res = plain.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: counterEntry(t, 1)})
	if err, ok := res.(error); !ok || !errors.Is(err, ErrHalted) {
		t.Fatalf("module entry without the module: response %v", res)
	}
	if _, reason := plain.Halted(); !strings.Contains(reason, "test-counter") {
		t.Fatalf("halt reason %q does not name the module", reason)
	}
}

func TestModuleConfigValidation(t *testing.T) {
	for _, mods := range [][]Module{{&counter{}, &counter{}}, {&badName{}}} {
		if _, err := New(Config{Partitions: testP, Groups: testG, Shards: testS, Modules: mods}); err == nil {
			t.Fatalf("modules %v accepted", mods)
		}
	}
	if _, err := AppendModuleEntry(nil, EntryTrack, 1, nil); !errors.Is(err, ErrUnknownEntryType) {
		t.Fatalf("AppendModuleEntry of a core type: %v", err)
	}
}

type badName struct{ counter }

func (*badName) Name() string { return "Bad Name" }
