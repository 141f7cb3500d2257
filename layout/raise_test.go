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
