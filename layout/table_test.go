package layout

import (
	"errors"
	"slices"
	"testing"
)

// The arithmetic table answers exactly what GroupOf answers, for every
// partition of every valid (p, g) up to 130 partitions.
func TestArithmeticTableIsGroupOf(t *testing.T) {
	for p := 1; p <= 130; p++ {
		for g := 1; g <= p; g++ {
			tab := ArithmeticTable(p, g)
			if err := tab.Validate(p); err != nil {
				t.Fatalf("p=%d g=%d: %v", p, g, err)
			}
			if tab.Epoch != 0 {
				t.Fatalf("p=%d g=%d: epoch %d, want 0", p, g, tab.Epoch)
			}
			for q := range p {
				if got, want := tab.GroupOf(q), GroupOf(q, p, g); got != want {
					t.Fatalf("p=%d g=%d partition %d: table says %d, GroupOf %d", p, g, q, got, want)
				}
			}
		}
	}
}

func TestTableMoveAndOwned(t *testing.T) {
	a := ArithmeticTable(64, 4)
	m := a.Move(31, 2)
	if m.Epoch != 1 || m.GroupOf(31) != 2 || a.GroupOf(31) != 1 {
		t.Fatalf("after Move(31, 2): epoch %d owner %d (original now %d)", m.Epoch, m.GroupOf(31), a.GroupOf(31))
	}
	if got := m.Owned(1); len(got) != 15 || got[0] != 16 || got[14] != 30 {
		t.Fatalf("group 1 owns %v, want 16..30", got)
	}
	if got := m.Owned(2); len(got) != 17 || got[0] != 31 {
		t.Fatalf("group 2 owns %v, want 31..47", got)
	}
	// A move to a group beyond the count raises it (a new, empty group).
	if n := a.Move(0, 5); n.Groups != 6 || n.Validate(64) != nil || len(n.Owned(4)) != 0 {
		t.Fatalf("move to group 5: groups %d, validate %v", n.Groups, n.Validate(64))
	}
	if a.Equal(m) || !m.Equal(a.Move(31, 2)) {
		t.Fatal("Equal disagrees with the tables' contents")
	}
}

func TestTableValidate(t *testing.T) {
	ok := ArithmeticTable(8, 2)
	bad := map[string]*Table{
		"nil":              nil,
		"short":            {Groups: 2, Owner: make([]uint16, 7)},
		"zero groups":      {Groups: 0, Owner: make([]uint16, 8)},
		"more groups than": {Groups: 9, Owner: make([]uint16, 8)},
		"owner too high":   {Groups: 2, Owner: []uint16{0, 0, 0, 0, 1, 1, 1, 2}},
	}
	if err := ok.Validate(8); err != nil {
		t.Fatal(err)
	}
	for name, tab := range bad {
		if err := tab.Validate(8); !errors.Is(err, ErrInvalidTable) {
			t.Errorf("%s: Validate = %v, want ErrInvalidTable", name, err)
		}
	}
}

func TestTableRuns(t *testing.T) {
	tab := ArithmeticTable(64, 4).Move(31, 2).Move(0, 3)
	runs := tab.Runs()
	want := []Run{{0, 3}, {1, 0}, {16, 1}, {31, 2}, {48, 3}}
	if !slices.Equal(runs, want) {
		t.Fatalf("runs %v, want %v", runs, want)
	}
	back, err := FromRuns(tab.Epoch, tab.Groups, 64, runs)
	if err != nil || !back.Equal(tab) {
		t.Fatalf("FromRuns(Runs()) = %v, %v; want the table back", back, err)
	}
	for name, rs := range map[string][]Run{
		"empty":         nil,
		"not from 0":    {{1, 0}},
		"not rising":    {{0, 0}, {5, 1}, {5, 2}},
		"past the end":  {{0, 0}, {64, 1}},
		"same adjacent": {{0, 0}, {8, 0}},
		"bad group":     {{0, 0}, {8, 4}},
		"negative":      {{0, -1}},
	} {
		if _, err := FromRuns(1, 4, 64, rs); !errors.Is(err, ErrInvalidTable) {
			t.Errorf("%s: FromRuns = %v, want ErrInvalidTable", name, err)
		}
	}
	if _, err := FromRuns(1, 4, 0, []Run{{0, 0}}); !errors.Is(err, ErrInvalidTable) {
		t.Errorf("zero partitions: %v", err)
	}
}
