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

// TestFreshSplitRefreshesAhead: series remembered from the previous
// interval only come back as "ahead" once (marked fresh at once), the
// ones never accepted as stale; forget unmarks them; after a refresh that
// succeeded (nothing forgotten) they stay fresh through the next rotation,
// where without refresh-ahead they would be stale.
func TestFreshSplitRefreshesAhead(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newFresh(30*time.Second, 100, func() time.Time { return now })
	f.accepted("a", []uint64{1, 2, 3}, nil)
	if stale, ahead := f.split("a", []uint64{1, 2, 3, 9}); !slices.Equal(stale, []uint64{9}) || len(ahead) != 0 {
		t.Fatalf("same interval: stale %v ahead %v, want [9] []", stale, ahead)
	}
	now = now.Add(31 * time.Second)
	stale, ahead := f.split("a", []uint64{1, 2, 3, 9})
	if !slices.Equal(stale, []uint64{9}) || !slices.Equal(ahead, []uint64{1, 2, 3}) {
		t.Fatalf("one interval later: stale %v ahead %v, want [9] [1 2 3]", stale, ahead)
	}
	if stale, ahead := f.split("a", []uint64{1, 2, 3}); len(stale) != 0 || len(ahead) != 0 {
		t.Fatalf("picked once only: stale %v ahead %v", stale, ahead)
	}
	f.forget("a", []uint64{2})
	if stale, ahead := f.split("a", []uint64{2}); len(stale) != 0 || !slices.Equal(ahead, []uint64{2}) {
		t.Fatalf("forgotten: stale %v ahead %v, want [] [2]", stale, ahead)
	}
	now = now.Add(31 * time.Second) // the refreshed series are now in the previous generation
	if stale, ahead := f.split("a", []uint64{1, 2, 3}); len(stale) != 0 || len(ahead) != 3 {
		t.Fatalf("refreshed series a rotation later: stale %v ahead %v, want none stale", stale, ahead)
	}
	if f.n != 3 {
		t.Fatalf("remembered %d, want 3", f.n)
	}
}
