package fsm

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/layout"
)

const testP, testG, testS = 64, 4, 16

func newTestFSM(t testing.TB, group int) *FSM {
	t.Helper()
	f, err := New(Config{Partitions: testP, Groups: testG, Shards: testS, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// hashIn returns a random hash owned by the FSM's group.
func hashIn(r *rand.Rand, f *FSM) uint64 {
	lo, hi := f.PartitionRange()
	first, last := layout.PartitionHashRange(lo+r.IntN(hi-lo), testP)
	return first + r.Uint64N(last-first)
}

func snapBytes(t testing.TB, f *FSM) []byte {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	var buf bytes.Buffer
	if err := s.(*snapshot).encode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type logEntry struct {
	index uint64
	data  []byte
}

// randomLog makes a log of track entries (new series and refreshes, several
// tenants) with an expire entry whenever the minute advances.
func randomLog(f *FSM, seed uint64, n, perEntry int) []logEntry {
	r := rand.New(rand.NewPCG(seed, seed+1))
	var out []logEntry
	var known []uint64
	now := int64(29_000_000)
	idx := uint64(1)
	for i := 0; i < n; i++ {
		if r.IntN(10) == 0 {
			now++
			out = append(out, logEntry{idx, AppendExpire(nil, now, 5)})
			idx++
		}
		var ths []TenantHashes
		for tn := 0; tn < 1+r.IntN(3); tn++ {
			th := TenantHashes{Tenant: fmt.Sprintf("tenant-%d", r.IntN(5))}
			for j := 0; j < perEntry; j++ {
				if len(known) > 0 && r.IntN(3) == 0 {
					th.Hashes = append(th.Hashes, known[r.IntN(len(known))])
				} else {
					h := hashIn(r, f)
					known = append(known, h)
					th.Hashes = append(th.Hashes, h)
				}
			}
			ths = append(ths, th)
		}
		out = append(out, logEntry{idx, AppendTrack(nil, now, ths)})
		idx++
	}
	return out
}

func apply(t testing.TB, f *FSM, entries []logEntry) {
	t.Helper()
	for _, e := range entries {
		if res := f.Apply(&raft.Log{Index: e.index, Term: 1, Type: raft.LogCommand, Data: e.data}); res != nil {
			t.Fatalf("apply %d: %v", e.index, res)
		}
	}
}

func TestDeterministicSnapshots(t *testing.T) {
	a, b := newTestFSM(t, 1), newTestFSM(t, 1)
	log := randomLog(a, 7, 300, 200)
	apply(t, a, log)
	apply(t, b, log)
	sa, sb := snapBytes(t, a), snapBytes(t, b)
	if !bytes.Equal(sa, sb) {
		t.Fatalf("two FSMs fed the same log wrote different snapshots (%d vs %d bytes)", len(sa), len(sb))
	}
	if a.Stats().Series == 0 {
		t.Fatal("log produced no series; the test would prove nothing")
	}
	// A replica restored from a mid-log snapshot and replaying the rest is identical too.
	c, mid := newTestFSM(t, 1), newTestFSM(t, 1)
	apply(t, mid, log[:150])
	if err := c.Restore(io.NopCloser(bytes.NewReader(snapBytes(t, mid)))); err != nil {
		t.Fatal(err)
	}
	apply(t, c, log[150:])
	if sc := snapBytes(t, c); !bytes.Equal(sa, sc) {
		t.Fatal("restore + replay differs from the live state")
	}
	for _, tn := range a.Tenants() {
		if got := c.TenantActive(tn.Name); got != tn.Active() {
			t.Fatalf("tenant %s: restored count %d, live %d", tn.Name, got, tn.Active())
		}
	}
}

// TestSnapshotUnderConcurrentApplies proves the copy-on-write snapshot: Persist runs
// while applies (tracks, refreshes and expiries touching the captured tables)
// continue, and the bytes it writes equal a quiescent snapshot at the same index;
// restoring them and replaying the later entries reproduces the live state.
func TestSnapshotUnderConcurrentApplies(t *testing.T) {
	live, ref := newTestFSM(t, 2), newTestFSM(t, 2)
	log := randomLog(live, 11, 400, 500)
	half := len(log) / 2
	apply(t, live, log[:half])
	apply(t, ref, log[:half])

	for round := 0; round < 3; round++ {
		snap, err := live.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := snap.(*snapshot).encode(&buf); err != nil {
				t.Error(err)
			}
			snap.Release()
		}()
		// Applies (and concurrent readers, as the leader does) go on meanwhile.
		stop := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(3, 4))
			out := make([]uint8, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				hs := make([]uint64, 64)
				for i := range hs {
					hs[i] = hashIn(r, live)
				}
				live.Lookup("tenant-1", hs, live.Now(), 5, out)
			}
		}()
		end := min(len(log), half+(round+1)*half/3)
		start := half + round*half/3
		apply(t, live, log[start:end])
		close(stop)
		wg.Wait()

		want := snapBytes(t, ref)
		if !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("round %d: snapshot persisted under concurrent applies differs from the quiescent one at the same index", round)
		}
		restored := newTestFSM(t, 2)
		if err := restored.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
			t.Fatal(err)
		}
		apply(t, restored, log[start:end])
		if !bytes.Equal(snapBytes(t, restored), snapBytes(t, live)) {
			t.Fatalf("round %d: restore + replay differs from live state", round)
		}
		apply(t, ref, log[start:end])
	}
}

func TestTrackAndExpire(t *testing.T) {
	f := newTestFSM(t, 0)
	r := rand.New(rand.NewPCG(1, 2))
	now := int64(29_000_000)
	old := []uint64{hashIn(r, f), hashIn(r, f), hashIn(r, f)}
	young := []uint64{hashIn(r, f), hashIn(r, f)}
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now, []TenantHashes{{Tenant: "t", Hashes: old}})))
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now+15, []TenantHashes{{Tenant: "t", Hashes: young}})))
	if got := f.TenantActive("t"); got != 5 {
		t.Fatalf("active = %d, want 5", got)
	}
	states := make([]uint8, 5)
	all := append(append([]uint64{}, old...), young...)
	f.Lookup("t", all, now+15, 20, states)
	for i, s := range states {
		want := uint8(StateActive)
		if i >= 3 {
			want = StateFresh
		}
		if s != want {
			t.Fatalf("hash %d state %d want %d", i, s, want)
		}
	}
	// At now+20 the old ones are idle (age 20 ≥ 20) but still stored until expired.
	f.Lookup("t", all, now+20, 20, states)
	if states[0] != StateAbsent || states[3] != StateActive {
		t.Fatalf("states at +20: %v", states)
	}
	f.ApplyEntry(mustDecode(t, AppendExpire(nil, now+20, 20)))
	if got := f.TenantActive("t"); got != 2 {
		t.Fatalf("after expire active = %d, want 2", got)
	}
	// Refreshing keeps a series alive past its first idle horizon.
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now+30, []TenantHashes{{Tenant: "t", Hashes: young[:1]}})))
	f.ApplyEntry(mustDecode(t, AppendExpire(nil, now+36, 20)))
	if got := f.TenantActive("t"); got != 1 {
		t.Fatalf("after refresh+expire active = %d, want 1", got)
	}
	if f.Stats().Series != 1 {
		t.Fatalf("stats series = %d", f.Stats().Series)
	}
}

// Without expire entries for a long time (no leader), the FSM expires on its own
// before the minute ring could wrap and resurrect idle series.
func TestSelfExpireWhenExpiriesStop(t *testing.T) {
	f := newTestFSM(t, 0)
	r := rand.New(rand.NewPCG(5, 6))
	now := int64(29_000_000)
	h := hashIn(r, f)
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now, []TenantHashes{{Tenant: "t", Hashes: []uint64{h}}})))
	// 120 minutes later the one-byte clock reads the same value again.
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now+RingMinutes, []TenantHashes{{Tenant: "u", Hashes: []uint64{hashIn(r, f)}}})))
	if got := f.TenantActive("t"); got != 0 {
		t.Fatalf("series idle for 120 minutes still counted: active = %d", got)
	}
}

func TestClockNeverGoesBackwards(t *testing.T) {
	f := newTestFSM(t, 0)
	r := rand.New(rand.NewPCG(8, 9))
	h := hashIn(r, f)
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, 29_000_010, []TenantHashes{{Tenant: "t", Hashes: []uint64{h}}})))
	// A new leader with a slower clock stamps an earlier minute: the FSM keeps its time.
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, 29_000_001, []TenantHashes{{Tenant: "t", Hashes: []uint64{h}}})))
	if f.Now() != 29_000_010 {
		t.Fatalf("Now() = %d, want 29000010", f.Now())
	}
	st := make([]uint8, 1)
	f.Lookup("t", []uint64{h}, f.Now(), 20, st)
	if st[0] != StateFresh {
		t.Fatalf("state %d, want fresh", st[0])
	}
}

func TestRestoreRejectsOtherLayout(t *testing.T) {
	a := newTestFSM(t, 0)
	apply(t, a, randomLog(a, 1, 5, 10))
	b := newTestFSM(t, 1) // other partition range
	before := snapBytes(t, b)
	if err := b.Restore(io.NopCloser(bytes.NewReader(snapBytes(t, a)))); err == nil {
		t.Fatal("restore of another group's snapshot accepted")
	}
	if !bytes.Equal(before, snapBytes(t, b)) {
		t.Fatal("a refused restore changed the state")
	}
	// Corrupt bytes are refused, and nothing changes.
	raw := snapBytes(t, a)
	raw[len(raw)/2] ^= 0xff
	c := newTestFSM(t, 0)
	if err := c.Restore(io.NopCloser(bytes.NewReader(raw))); err == nil {
		t.Fatal("corrupt snapshot accepted")
	}
}

func mustDecode(t testing.TB, b []byte) Entry {
	t.Helper()
	e, err := DecodeEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The same after a leaderless gap when the first entry is an expire.
func TestExpireAfterLongGap(t *testing.T) {
	f := newTestFSM(t, 0)
	r := rand.New(rand.NewPCG(5, 7))
	now := int64(29_000_000)
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now, []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(r, f)}}})))
	f.ApplyEntry(mustDecode(t, AppendTrack(nil, now+19, []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(r, f)}}})))
	f.ApplyEntry(mustDecode(t, AppendExpire(nil, now+RingMinutes+5, 20)))
	if got := f.TenantActive("t"); got != 0 {
		t.Fatalf("after a %d-minute gap, %d idle series survived the expiry", RingMinutes+5, got)
	}
	// A short gap keeps the young one: at +25 the +19 series is 6 minutes old.
	g := newTestFSM(t, 0)
	g.ApplyEntry(mustDecode(t, AppendTrack(nil, now, []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(r, g)}}})))
	g.ApplyEntry(mustDecode(t, AppendTrack(nil, now+19, []TenantHashes{{Tenant: "t", Hashes: []uint64{hashIn(r, g)}}})))
	g.ApplyEntry(mustDecode(t, AppendExpire(nil, now+25, 20)))
	if got := g.TenantActive("t"); got != 1 {
		t.Fatalf("active = %d, want 1", got)
	}
}
