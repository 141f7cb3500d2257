package layout

import (
	"errors"
	"slices"
	"testing"
)

func TestTableRaise(t *testing.T) {
	base := ArithmeticTable(16, 4)
	next, changed, err := base.Raise(8)
	if err != nil || !changed {
		t.Fatalf("Raise(8) = %v, %v", changed, err)
	}
	if next.Groups != 8 || next.Epoch != base.Epoch+1 || !slices.Equal(next.Owner, base.Owner) {
		t.Fatalf("raised table = %+v, want the same owners, 8 groups, epoch %d", next, base.Epoch+1)
	}
	if err := next.Validate(16); err != nil {
		t.Fatal(err)
	}
	for g := 4; g < 8; g++ {
		if len(next.Owned(g)) != 0 {
			t.Fatalf("new group %d owns %v", g, next.Owned(g))
		}
	}
	// Owners are copied: the raised table does not alias the old one.
	next.Owner[0] = 7
	if base.Owner[0] != 0 {
		t.Fatal("Raise aliased the old table's owners")
	}

	same, changed, err := base.Raise(4)
	if err != nil || changed || same != base {
		t.Fatalf("Raise(4) of a 4-group table = %p, %v, %v; want itself, unchanged", same, changed, err)
	}
	if _, _, err := base.Raise(2); !errors.Is(err, ErrLowerGroups) {
		t.Fatalf("Raise(2) err = %v, want ErrLowerGroups", err)
	}
	if _, _, err := base.Raise(17); !errors.Is(err, ErrInvalidTable) {
		t.Fatalf("Raise(17) of 16 partitions err = %v, want ErrInvalidTable", err)
	}
	if full, _, err := base.Raise(16); err != nil || full.Groups != 16 {
		t.Fatalf("Raise(16) = %v, %v", full, err)
	}
}

func TestGroupSpanMatchesRaisedTable(t *testing.T) {
	for _, c := range []struct{ p, base, groups int }{{64, 4, 8}, {16, 3, 5}, {8, 1, 8}, {10, 10, 10}} {
		tbl, _, err := ArithmeticTable(c.p, c.base).Raise(c.groups)
		if err != nil {
			t.Fatal(err)
		}
		for g := range c.groups {
			lo, hi := GroupSpan(g, c.p, c.base)
			var want []int
			for q := lo; q < hi; q++ {
				want = append(want, q)
			}
			if got := tbl.Owned(g); !slices.Equal(got, want) {
				t.Fatalf("p=%d base=%d: group %d owns %v in the raised table, GroupSpan says [%d,%d)", c.p, c.base, g, got, lo, hi)
			}
		}
	}
}

// Every partition has one target owner; each group's target is one
// contiguous range, within two partitions of each other when the count
// doubles (at most about twice another's otherwise); raising to base
// changes nothing; 4 → 8 moves only the upper half of each old group.
func TestRaiseTarget(t *testing.T) {
	for _, c := range []struct{ p, base, n int }{{64, 4, 8}, {64, 4, 16}, {64, 3, 7}, {10, 2, 10}, {1024, 4, 1024}, {16, 4, 4}} {
		owner := RaiseTarget(c.p, c.base, c.n)
		count := make([]int, c.n)
		last := map[int]int{}
		for p, g := range owner {
			if g < 0 || g >= c.n {
				t.Fatalf("%+v: partition %d → group %d", c, p, g)
			}
			if q, ok := last[g]; ok && q != p-1 {
				t.Fatalf("%+v: group %d's range is not contiguous at partition %d", c, g, p)
			}
			last[g] = p
			count[g]++
		}
		lo, hi := c.p, 0
		for _, n := range count {
			lo, hi = min(lo, n), max(hi, n)
		}
		doubling := c.n%c.base == 0 && (c.n/c.base)&(c.n/c.base-1) == 0
		if lo == 0 || doubling && hi-lo > 2 || hi > 2*lo+2 {
			t.Fatalf("%+v: group sizes from %d to %d", c, lo, hi)
		}
	}
	base := RaiseTarget(64, 4, 4)
	eight := RaiseTarget(64, 4, 8)
	for p := range 64 {
		if base[p] != GroupOf(p, 64, 4) {
			t.Fatalf("raise to base moves partition %d", p)
		}
		if eight[p] != base[p] && (eight[p] != base[p]+4 || p%16 < 8) {
			t.Fatalf("4 → 8: partition %d from group %d to %d", p, base[p], eight[p])
		}
	}
}
