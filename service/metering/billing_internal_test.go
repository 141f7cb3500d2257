package metering

import (
	"math/rand/v2"
	"testing"

	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
)

// perMinute expands per-group samples into per-minute totals the direct
// way (one entry per minute; each sample holds until its group's next), as
// the definition ComputeBill takes.
func perMinute(groups [][]fsmmeter.Sample, fromMin, toMin int64) map[int64]int64 {
	per := map[int64]int64{}
	for _, all := range groups {
		var ss []fsmmeter.Sample
		for _, x := range all {
			if x.Minute < toMin {
				ss = append(ss, x)
			}
		}
		for i, x := range ss {
			end := toMin
			if i+1 < len(ss) {
				end = ss[i+1].Minute
			}
			for m := max(x.Minute, fromMin); m < end; m++ {
				per[m] += x.Active
			}
		}
	}
	return per
}

// TestStepBillMatchesComputeBill: the step computation gives ComputeBill's
// numbers on random samples (groups starting at different minutes, zero
// counts, windows cutting samples on both sides, empty windows).
func TestStepBillMatchesComputeBill(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 3000 {
		groups := make([][]fsmmeter.Sample, 1+rng.IntN(4))
		for g := range groups {
			m := int64(rng.IntN(50))
			for range rng.IntN(12) {
				v := int64(rng.IntN(6)) * int64(rng.IntN(100))
				groups[g] = append(groups[g], fsmmeter.Sample{Minute: m, Active: v})
				m += 1 + int64(rng.IntN(20))
			}
		}
		fromMin := int64(rng.IntN(120))
		toMin := fromMin + int64(rng.IntN(150)) - 10
		wp, wm, wn := ComputeBill(perMinute(groups, fromMin, toMin))
		gp, gm, gn := stepBill(groups, fromMin, toMin)
		if gp != wp || gm != wm || gn != wn {
			t.Fatalf("iteration %d: groups %v [%d, %d): stepBill = p95 %d max %d n %d, ComputeBill = %d %d %d", iter, groups, fromMin, toMin, gp, gm, gn, wp, wm, wn)
		}
	}
}

// TestStepBillExample: 20 minutes of 40·k series (k = 1..20): nearest-rank
// p95 of 20 values is the 19th.
func TestStepBillExample(t *testing.T) {
	var g0, g1 []fsmmeter.Sample
	for k := range int64(20) {
		g0 = append(g0, fsmmeter.Sample{Minute: 100 + k, Active: 30 * (k + 1)})
		g1 = append(g1, fsmmeter.Sample{Minute: 100 + k, Active: 10 * (k + 1)})
	}
	if p, m, n := stepBill([][]fsmmeter.Sample{g0, g1}, 100, 120); p != 19*40 || m != 800 || n != 20 {
		t.Fatalf("p95 %d max %d minutes %d", p, m, n)
	}
}
