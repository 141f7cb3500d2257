package history

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestPsetAgainstAMap: random inserts (with repeats, and values that share
// their mixed prefixes) against a map; every earlier version is unchanged
// after later inserts (the states porcupine keeps must not move); the same
// set built in another order is equal and hashes the same; a set one value
// apart is not equal.
func TestPsetAgainstAMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var s pset
	want := map[uint64]bool{}
	type version struct {
		s    pset
		vals []uint64
	}
	var versions []version
	for i := range 5000 {
		v := r.Uint64N(4000) // repeats
		if i%7 == 0 {
			v = r.Uint64()
		}
		s = s.Insert(v)
		want[v] = true
		if s.Len() != len(want) {
			t.Fatalf("after %d inserts: Len %d, want %d", i+1, s.Len(), len(want))
		}
		if i%500 == 0 {
			versions = append(versions, version{s, slices.Sorted(maps.Keys(want))})
		}
	}
	for v := range uint64(5000) {
		if s.Contains(v) != want[v] {
			t.Fatalf("Contains(%d) = %v, want %v", v, s.Contains(v), want[v])
		}
	}
	for i, ver := range versions {
		if ver.s.Len() != len(ver.vals) {
			t.Fatalf("version %d: Len %d, want %d (changed by later inserts)", i, ver.s.Len(), len(ver.vals))
		}
		for _, v := range ver.vals {
			if !ver.s.Contains(v) {
				t.Fatalf("version %d lost %d", i, v)
			}
		}
		if got := ver.s.some(len(ver.vals) + 1); !slices.Equal(got, ver.vals) {
			t.Fatalf("version %d holds %d values, want %d", i, len(got), len(ver.vals))
		}
	}

	vals := slices.Sorted(maps.Keys(want))
	var back pset
	for i := len(vals) - 1; i >= 0; i-- {
		back = back.Insert(vals[i])
	}
	if !s.equal(back) || s.sum != back.sum {
		t.Fatal("the same set built in reverse order is not equal, or hashes differently")
	}
	if !s.equal(s.Insert(vals[0])) {
		t.Fatal("inserting a member changed the set")
	}
	extra := s.Insert(1 << 63)
	if s.equal(extra) || extra.equal(s) {
		t.Fatal("sets one value apart compare equal")
	}
	// Same size, one value swapped.
	var a, b pset
	for _, v := range vals[:100] {
		a, b = a.Insert(v), b.Insert(v)
	}
	a, b = a.Insert(1<<62), b.Insert(1<<61)
	if a.equal(b) {
		t.Fatal("sets of equal size that differ in one value compare equal")
	}
}

// TestTrackingModelLongKey: one key whose set grows to 80,000 series over
// 8,000 sequential requests checks in well under a second; with a copy of
// the set at each step, the states porcupine keeps would add up to about
// 2.6 GB (8,000 copies of 40,000 values on average, 8 bytes each).
func TestTrackingModelLongKey(t *testing.T) {
	if testing.Short() {
		t.Skip("an 8,000-operation history; runs in make test")
	}
	var ops []Op
	var next uint64
	for i := range 8000 {
		hs := make([]uint64, 12)
		for j := range hs {
			if j < 10 {
				next++
				hs[j] = next * 0x9e3779b97f4a7c15 // new
			} else {
				hs[j] = uint64(1+i%int(next)) * 0x9e3779b97f4a7c15 // a re-send
			}
		}
		ops = append(ops, tr(i%4, int64(2*i), int64(2*i+1), "t#0", hs, OK))
	}
	start := time.Now()
	if err := Check(TrackingModel(func(string) int { return 0 }), ops, "", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("8,000 requests, 80,000 series on one key: checked in %v", time.Since(start).Round(time.Millisecond))
	// The same history with an acknowledged series refused at the end.
	bad := append(slices.Clone(ops), tr(0, 1<<40, 1<<40+1, "t#0", []uint64{0x9e3779b97f4a7c15}, Rejected, 0x9e3779b97f4a7c15))
	if err := Check(TrackingModel(func(string) int { return 0 }), bad, "", 2*time.Minute); err == nil {
		t.Fatal("an acknowledged series refused at the end was not caught")
	}
}
