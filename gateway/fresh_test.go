package gateway

import (
	"slices"
	"testing"
	"time"
)

// TestFreshRemembersAcceptedOnly: accepted series are skipped for one to two
// intervals, rejected ones never, tenants apart; the bound holds.
func TestFreshRemembersAcceptedOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newFresh(30*time.Second, 5, func() time.Time { return now })
	hs := []uint64{1, 2, 3, 4}
	if got := f.stale("a", hs); !slices.Equal(got, hs) {
		t.Fatalf("nothing tracked yet: stale %v", got)
	}
	f.accepted("a", hs, []uint64{3})
	if got := f.stale("a", []uint64{1, 2, 3, 4, 9}); !slices.Equal(got, []uint64{3, 9}) {
		t.Fatalf("after accepting 1,2,4: stale %v, want [3 9]", got)
	}
	if got := f.stale("b", hs); !slices.Equal(got, hs) {
		t.Fatalf("another tenant: stale %v", got)
	}
	now = now.Add(31 * time.Second) // one rotation: still remembered (previous generation)
	if got := f.stale("a", hs); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("one interval later: stale %v, want [3]", got)
	}
	now = now.Add(31 * time.Second) // two: tracked again
	if got := f.stale("a", hs); !slices.Equal(got, hs) {
		t.Fatalf("two intervals later: stale %v, want all", got)
	}
	f.accepted("a", []uint64{10, 11, 12, 13, 14, 15, 16}, nil)
	if f.n != 5 {
		t.Fatalf("remembered %d, bound 5", f.n)
	}
	if got := f.stale("a", []uint64{15, 16}); len(got) != 2 {
		t.Fatalf("over the bound: %v should be tracked", got)
	}
}
