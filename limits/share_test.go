package limits

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// shareCase is one table row: a limit, P partitions cut into groups by
// weights (the partitions each group owns, in order).
type shareCase struct {
	limit   int64
	weights []int
}

func (c shareCase) p() (p int) {
	for _, w := range c.weights {
		p += w
	}
	return p
}

// shareTable: limits from unlimited to near int64's top, over even and
// uneven cuts of P (the default 64 in 4 groups, 1 group, single-partition
// groups, random weights).
func shareTable() []shareCase {
	var cs []shareCase
	lims := []int64{0, 1, 2, 3, 7, 63, 64, 65, 1000, 4000, 150_000, 1_000_003, 1 << 40, math.MaxInt64 / 64}
	cuts := [][]int{{64}, {16, 16, 16, 16}, {1, 1, 1}, {21, 21, 22}, {1, 62, 1}, {3, 5, 7, 11, 13, 25}}
	r := rand.New(rand.NewPCG(35, 5))
	for range 20 {
		w := make([]int, 1+r.IntN(16))
		for i := range w {
			w[i] = 1 + r.IntN(20)
		}
		cuts = append(cuts, w)
	}
	for _, l := range lims {
		for _, w := range cuts {
			cs = append(cs, shareCase{l, w})
		}
	}
	for range 200 {
		cs = append(cs, shareCase{r.Int64N(1 << 32), cuts[r.IntN(len(cuts))]})
	}
	return cs
}

// TestGroupShare checks the one share rule against the formulas the three
// places that computed it each had (written out here as the oracle): the
// movable bases sum to exactly the limit, the static base is the rounded-up
// proportion, and the share is base + delta − reservedOut, 0 for an
// unlimited tenant, NoHeadroom when nothing is left.
func TestGroupShare(t *testing.T) {
	deltas := [][2]int64{{0, 0}, {5, 0}, {-3, 0}, {0, 2}, {10, 4}, {-1_000_000, 0}}
	for _, c := range shareTable() {
		p := c.p()
		var sum int64
		lo := 0
		for g, w := range c.weights {
			hi := lo + w
			mov, _ := GroupShare(c.limit, lo, hi, p, Movable, 0, 0)
			st, _ := GroupShare(c.limit, lo, hi, p, Static, 0, 0)
			var wantMov, wantSt int64
			if c.limit > 0 {
				wantMov = floorMul(c.limit, hi, p) - floorMul(c.limit, lo, p)
				if c.limit <= math.MaxInt64/int64(p) {
					wantSt = (c.limit*int64(w) + int64(p) - 1) / int64(p)
				} else {
					wantSt = st // the static formula overflows there, as it always did; not compared
				}
			}
			if mov != wantMov || st != wantSt {
				t.Fatalf("limit %d weights %v group %d [%d,%d): movable %d static %d, want %d and %d", c.limit, c.weights, g, lo, hi, mov, st, wantMov, wantSt)
			}
			if c.limit > 0 && (st < mov || st > mov+1) {
				t.Fatalf("limit %d weights %v group %d: static %d not within one above movable %d", c.limit, c.weights, g, st, mov)
			}
			for _, split := range []Split{Movable, Static} {
				base, _ := GroupShare(c.limit, lo, hi, p, split, 0, 0)
				for _, d := range deltas {
					b, share := GroupShare(c.limit, lo, hi, p, split, d[0], d[1])
					want := base + d[0] - d[1]
					switch {
					case c.limit == 0:
						want = 0
					case want <= 0:
						want = NoHeadroom
					}
					if b != base || share != want || ShareOver(c.limit, base, d[0], d[1]) != want {
						t.Fatalf("limit %d group [%d,%d) split %d delta %v: base %d share %d, want %d and %d", c.limit, lo, hi, split, d, b, share, base, want)
					}
				}
			}
			sum += mov
			lo = hi
		}
		if sum != c.limit {
			t.Fatalf("limit %d weights %v: movable bases sum to %d", c.limit, c.weights, sum)
		}
	}
}

// floorMul is ⌊limit·n/p⌋ in 128-bit arithmetic (the oracle for mulDiv);
// n ≤ p, so the quotient fits.
func floorMul(limit int64, n, p int) int64 {
	hi, lo := bits.Mul64(uint64(limit), uint64(n))
	q, _ := bits.Div64(hi, lo, uint64(p))
	return int64(q)
}
