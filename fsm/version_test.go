package fsm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

func TestRegistry(t *testing.T) {
	types := EntryTypes()
	want := []EntryTypeInfo{{EntryTrack, "track", 1, ""}, {EntryExpire, "expire", 1, ""}, {EntryDropTenant, "drop-tenant", 2, ""}}
	if len(types) < len(want) {
		t.Fatalf("registry %+v, want at least %+v", types, want)
	}
	maxSince := 0
	seen := map[byte]bool{}
	names := map[string]bool{}
	for i, ty := range types {
		if i < len(want) && ty != want[i] {
			t.Errorf("registry[%d] = %+v, want %+v", i, ty, want[i])
		}
		if i >= len(want) && ty.Module == "" {
			t.Errorf("registry[%d] = %+v: types after the core ones belong to a module", i, ty)
		}
		if seen[ty.Type] || names[ty.Name] {
			t.Errorf("type %d or name %q registered twice", ty.Type, ty.Name)
		}
		seen[ty.Type], names[ty.Name] = true, true
		maxSince = max(maxSince, ty.Since)
		if got, ok := LookupEntryType(ty.Type); !ok || got != ty {
			t.Errorf("LookupEntryType(%d) = %+v, %v", ty.Type, got, ok)
		}
	}
	// Modules register higher versions; with none linked here, the core's
	// newest type is at most the build's version (the server package's
	// TestEntryRegistry checks the equality with every module linked).
	if maxSince > CurrentClusterVersion {
		t.Errorf("CurrentClusterVersion = %d, but the newest registered type needs %d", CurrentClusterVersion, maxSince)
	}
	if _, ok := LookupEntryType(0); ok {
		t.Error("type 0 is registered")
	}
	if _, err := AppendEntry(nil, Entry{Type: 99}); !errors.Is(err, ErrUnknownEntryType) {
		t.Errorf("AppendEntry of type 99: %v", err)
	}
}

// TestRegisterRefusesClashes: a module cannot take a type byte or a name
// already registered, nor claim a cluster version this build does not have;
// each is a panic at init, before any log is read.
func TestRegisterRefusesClashes(t *testing.T) {
	for name, reg := range map[string]func(){
		"type taken":      func() { RegisterModuleEntry("m", EntryTrack, "other", 1) },
		"name taken":      func() { RegisterModuleEntry("m", 251, "track", 1) },
		"no module":       func() { RegisterModuleEntry("", 251, "x", 1) },
		"future version":  func() { RegisterModuleEntry("m", 251, "x", CurrentClusterVersion+1) },
		"version 0":       func() { RegisterModuleEntry("m", 251, "x", 0) },
		"reserved type 0": func() { RegisterModuleEntry("m", 0, "x", 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: registered", name)
				}
			}()
			reg()
		}()
		if _, ok := LookupEntryType(251); ok {
			t.Fatalf("%s: type 251 is registered after a refused registration", name)
		}
	}
}

func TestDropTenantRoundTrip(t *testing.T) {
	e, err := DecodeEntry(AppendDropTenant(nil, 29_000_001, "tenant-x"))
	if err != nil || e.Type != EntryDropTenant || e.Tenant != "tenant-x" || e.Now != 29_000_001 {
		t.Fatalf("drop-tenant round trip: %+v %v", e, err)
	}
	if _, err := DecodeEntry(AppendDropTenant(nil, 1, "")); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("empty tenant accepted: %v", err)
	}
	// A replica at cluster version 1 does not know the type.
	if _, typ, err := decodeEntry(AppendDropTenant(nil, 1, "t"), 1); !errors.Is(err, ErrUnknownEntryType) || typ != EntryDropTenant {
		t.Fatalf("version 1 decode: type %d, %v", typ, err)
	}
}

func TestEntryRejectsNonMinimalVarint(t *testing.T) {
	good := AppendExpire(nil, 5, 20)
	// now = 5 written as two bytes (0x85 0x00) instead of one.
	b := append([]byte{good[0], good[1], 0x85, 0x00}, good[3:len(good)-4]...)
	b = resealRaw(b)
	if _, err := DecodeEntry(b); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("non-minimal uvarint accepted: %v", err)
	}
}

func TestDropTenant(t *testing.T) {
	f := newTestFSM(t, 1)
	r := rand.New(rand.NewPCG(3, 4))
	var hs, other []uint64
	for range 500 {
		hs = append(hs, hashIn(r, f))
		other = append(other, hashIn(r, f))
	}
	now := int64(29_000_000)
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now, []TenantHashes{{Tenant: "a", Hashes: hs}, {Tenant: "b", Hashes: other}})))
	wantRemoved := f.TenantActive("a")
	if wantRemoved == 0 {
		t.Fatal("no series tracked")
	}
	// A snapshot taken before the drop must still see the tenant's series.
	before := snapBytes(t, f)
	live, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	res := f.ApplyEntry(mustDecode(t, AppendDropTenant(nil, now, "a")))
	dr, ok := res.(DropResult)
	if !ok || dr.Removed != wantRemoved || dr.Tenant != "a" {
		t.Fatalf("drop result %#v, want %d removed", res, wantRemoved)
	}
	var buf bytes.Buffer
	if err := live.(*snapshot).encode(&buf); err != nil {
		t.Fatal(err)
	}
	live.Release()
	if !bytes.Equal(buf.Bytes(), before) {
		t.Error("a snapshot taken before the drop changed after it")
	}
	if n := f.TenantActive("a"); n != 0 {
		t.Fatalf("tenant a active %d after drop", n)
	}
	if n := f.TenantActive("b"); n != int64(len(other)) {
		t.Fatalf("tenant b active %d, want %d (untouched)", n, len(other))
	}
	states := make([]uint8, len(hs))
	f.Lookup("a", hs, now, 20, states)
	for i, st := range states {
		if st != StateAbsent {
			t.Fatalf("hash %d of a is %d after drop, want absent", i, st)
		}
	}
	// Its series count as new afterwards.
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now+1, []TenantHashes{{Tenant: "a", Hashes: hs[:10], New: 10}})))
	if n := f.TenantActive("a"); n != 10 {
		t.Fatalf("tenant a active %d after re-adding 10", n)
	}
	// Dropping an unknown tenant is a no-op.
	if res := f.ApplyEntry(mustDecode(t, AppendDropTenant(nil, now+1, "nobody"))); res.(DropResult).Removed != 0 {
		t.Fatalf("drop of unknown tenant: %#v", res)
	}
	// The replica that restores a snapshot taken after the drop agrees.
	g := newTestFSM(t, 1)
	if err := g.Restore(readCloser(snapBytes(t, f))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapBytes(t, g), snapBytes(t, f)) {
		t.Fatal("restored replica differs")
	}
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

func readCloser(b []byte) nopCloser { return nopCloser{bytes.NewReader(b)} }

func raftLog(index uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// TestHaltOnUnknownType feeds one log to a current replica and to one that
// supports cluster version 1 (an old build): the old one halts at the
// drop-tenant entry and applies nothing after it.
func TestHaltOnUnknownType(t *testing.T) {
	old, err := New(Config{Partitions: testP, Groups: testG, Shards: testS, Group: 0, MaxClusterVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	cur := newTestFSM(t, 0)
	r := rand.New(rand.NewPCG(5, 6))
	now := int64(29_000_000)
	track := func(tenant string, n int) []byte {
		var hs []uint64
		for range n {
			hs = append(hs, hashIn(r, cur))
		}
		return AppendTrack(nil, now, []TenantHashes{{Tenant: tenant, Hashes: hs, New: n}})
	}
	log := [][]byte{
		track("a", 50),
		track("b", 30),
		AppendDropTenant(nil, now, "a"), // index 3
		track("b", 20),
		AppendExpire(nil, now+1, 20),
		track("a", 5),
	}
	var oldSnapBefore []byte
	for i, data := range log {
		idx := uint64(i + 1)
		if idx == 3 {
			oldSnapBefore = snapBytes(t, old)
		}
		if res := cur.Apply(raftLog(idx, data)); res != nil {
			if _, ok := res.(DropResult); !ok {
				t.Fatalf("current replica: entry %d: %v", idx, res)
			}
		}
		res := old.Apply(raftLog(idx, data))
		if idx < 3 {
			if res != nil {
				t.Fatalf("old replica: entry %d: %v", idx, res)
			}
			continue
		}
		err, _ := res.(error)
		if !errors.Is(err, ErrHalted) {
			t.Fatalf("old replica: entry %d answered %v, want ErrHalted", idx, res)
		}
	}
	halted, why := old.Halted()
	if !halted || old.HaltedAt() != 3 {
		t.Fatalf("old replica: halted=%v at %d (%s)", halted, old.HaltedAt(), why)
	}
	for _, want := range []string{"raft index 3", "type 3", "drop-tenant", "supports cluster version 1"} {
		if !strings.Contains(why, want) {
			t.Errorf("halt reason %q does not mention %q", why, want)
		}
	}
	if got := old.AppliedIndex(); got != 2 {
		t.Errorf("old replica applied index %d, want 2 (the entry before the unknown one)", got)
	}
	if _, err := old.Snapshot(); !errors.Is(err, ErrHalted) {
		t.Errorf("Snapshot while halted: %v, want ErrHalted", err)
	}
	// Nothing after the halt was applied: the state is the one before index 3.
	h := old.halt.Load()
	old.halt.Store(nil) // peek at the state without the Snapshot guard
	if !bytes.Equal(snapBytes(t, old), oldSnapBefore) {
		t.Error("the halted replica's state changed after the halt")
	}
	old.halt.Store(h)
	if h, _ := cur.Halted(); h {
		t.Fatal("current replica halted")
	}

	// "Restart with a newer build": a fresh current FSM replays the log from
	// the beginning (no snapshot was possible past index 2) and converges.
	replay := newTestFSM(t, 0)
	for i, data := range log {
		replay.Apply(raftLog(uint64(i+1), data))
	}
	if !bytes.Equal(snapBytes(t, replay), snapBytes(t, cur)) || replay.AppliedIndex() != cur.AppliedIndex() {
		t.Fatal("replayed replica differs from the one that never halted")
	}
}

func TestHaltOnBadChecksum(t *testing.T) {
	f := newTestFSM(t, 0)
	good := AppendExpire(nil, 29_000_000, 20)
	if res := f.Apply(raftLog(1, good)); res != nil {
		t.Fatal(res)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 0xff
	res := f.Apply(raftLog(2, bad))
	if err, _ := res.(error); !errors.Is(err, ErrHalted) {
		t.Fatalf("damaged entry answered %v, want ErrHalted", res)
	}
	halted, why := f.Halted()
	if !halted || !strings.Contains(why, "checksum") || !strings.Contains(why, "raft index 2") {
		t.Fatalf("halted=%v reason %q", halted, why)
	}
	// A good entry after it is not applied either: never skip.
	if res := f.Apply(raftLog(3, AppendExpire(nil, 29_000_005, 20))); !errors.Is(res.(error), ErrHalted) {
		t.Fatalf("entry after the halt answered %v", res)
	}
	if f.AppliedIndex() != 1 || f.Now() != 29_000_000 {
		t.Fatalf("applied index %d now %d after halt, want 1 and the minute of entry 1", f.AppliedIndex(), f.Now())
	}
	if _, err := f.Snapshot(); !errors.Is(err, ErrHalted) {
		t.Fatalf("Snapshot while halted: %v", err)
	}
	// Installing a snapshot (the leader's state) ends the halt.
	src := newTestFSM(t, 0)
	src.Apply(raftLog(3, AppendExpire(nil, 29_000_005, 20)))
	if err := f.Restore(readCloser(snapBytes(t, src))); err != nil {
		t.Fatal(err)
	}
	if h, _ := f.Halted(); h || f.AppliedIndex() != 3 {
		t.Fatalf("after restore: halted=%v applied %d", h, f.AppliedIndex())
	}
	if res := f.Apply(raftLog(4, AppendExpire(nil, 29_000_006, 20))); res != nil {
		t.Fatalf("apply after restore: %v", res)
	}
}

func TestMaxClusterVersionValidated(t *testing.T) {
	for _, v := range []int{-1, CurrentClusterVersion + 1} {
		if _, err := New(Config{Partitions: testP, Groups: testG, Shards: testS, MaxClusterVersion: v}); err == nil {
			t.Errorf("max cluster version %d accepted", v)
		}
	}
}
