package shares

import (
	"testing"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/limits"
)

// TestOneShareFunction: the shares module's base (fsm/shares.Split), the
// mover's admission share (Share) and admission's sentinel are
// limits.GroupShare's, over a table of limits, group counts and uneven
// partition cuts (api.GroupRange, as the server cuts them).
func TestOneShareFunction(t *testing.T) {
	if admission.NoHeadroom != limits.NoHeadroom {
		t.Fatalf("admission.NoHeadroom %d, limits.NoHeadroom %d", admission.NoHeadroom, limits.NoHeadroom)
	}
	checked := 0
	for _, limit := range []int64{0, 1, 3, 64, 1000, 4000, 1_000_003, 1 << 40} {
		for _, pg := range [][2]int{{64, 1}, {64, 4}, {64, 5}, {64, 64}, {7, 3}, {100, 16}} {
			p, groups := pg[0], pg[1]
			var sum int64
			for g := range groups {
				lo, hi := api.GroupRange(g, p, groups)
				base := shares.Split(limit, lo, hi, p)
				for _, d := range [][2]int64{{0, 0}, {7, 0}, {-2, 1}, {0, 1 << 41}, {5, 5}} {
					wantBase, wantShare := limits.GroupShare(limit, lo, hi, p, limits.Movable, d[0], d[1])
					if base != wantBase || Share(limit, base, d[0], d[1]) != wantShare {
						t.Fatalf("limit %d, group %d of %d over %d partitions, delta %v: Split %d Share %d, limits.GroupShare %d %d",
							limit, g, groups, p, d, base, Share(limit, base, d[0], d[1]), wantBase, wantShare)
					}
					checked++
				}
				sum += base
			}
			if sum != limit {
				t.Fatalf("limit %d over %d groups of %d partitions: bases sum to %d", limit, groups, p, sum)
			}
		}
	}
	t.Logf("%d cases agree", checked)
}
