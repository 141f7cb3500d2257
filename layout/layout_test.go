package layout

import (
	"math"
	"testing"
)

func TestPartitionBounds(t *testing.T) {
	for _, p := range []int{1, 2, 3, 7, 64, 1000, MaxPartitions} {
		for _, h := range []uint64{0, 1, 1 << 32, math.MaxUint64, math.MaxUint64 >> 1, 0xdeadbeefcafebabe} {
			if got := Partition(h, p); got < 0 || got >= p {
				t.Fatalf("Partition(%#x, %d) = %d out of range", h, p, got)
			}
		}
		if Partition(0, p) != 0 || Partition(math.MaxUint64, p) != p-1 {
			t.Fatalf("p=%d: extremes map to %d and %d", p, Partition(0, p), Partition(math.MaxUint64, p))
		}
	}
}

func TestPartitionIsMonotoneRange(t *testing.T) {
	// Partitions must be contiguous ranges of hash space: monotone in the hash.
	const p = 64
	prev := 0
	for top := uint64(0); top < 1<<32; top += 1 << 20 {
		got := Partition(top<<32, p)
		if got < prev {
			t.Fatalf("partition went backwards at top=%#x: %d < %d", top, got, prev)
		}
		prev = got
	}
}

func TestGroupOfMatchesGroupRange(t *testing.T) {
	for p := 1; p <= 130; p++ {
		for g := 1; g <= p; g++ {
			covered := 0
			for i := 0; i < g; i++ {
				lo, hi := GroupRange(i, p, g)
				if hi <= lo {
					t.Fatalf("p=%d g=%d: group %d has empty range [%d,%d)", p, g, i, lo, hi)
				}
				for part := lo; part < hi; part++ {
					if got := GroupOf(part, p, g); got != i {
						t.Fatalf("p=%d g=%d: GroupOf(%d) = %d, want %d", p, g, part, got, i)
					}
					covered++
				}
			}
			if covered != p {
				t.Fatalf("p=%d g=%d: ranges cover %d partitions", p, g, covered)
			}
		}
	}
}

func TestValidateLayout(t *testing.T) {
	if err := ValidateLayout(64, 4, 16); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][3]int{{0, 1, 1}, {4, 5, 16}, {64, 0, 16}, {64, 4, 12}, {64, 4, 0}} {
		if ValidateLayout(c[0], c[1], c[2]) == nil {
			t.Errorf("ValidateLayout%v accepted", c)
		}
	}
}

func TestPartitionHashRange(t *testing.T) {
	for _, p := range []int{1, 3, 7, 64, 1000} {
		prevLast := uint64(0)
		for part := 0; part < p; part++ {
			first, last := PartitionHashRange(part, p)
			if Partition(first, p) != part || Partition(last, p) != part {
				t.Fatalf("p=%d part=%d: range [%#x,%#x] maps to %d..%d", p, part, first, last, Partition(first, p), Partition(last, p))
			}
			if part > 0 && first != prevLast+1 {
				t.Fatalf("p=%d part=%d: gap or overlap: first %#x after last %#x", p, part, first, prevLast)
			}
			prevLast = last
		}
		if prevLast != math.MaxUint64 {
			t.Fatalf("p=%d: ranges end at %#x", p, prevLast)
		}
	}
}
