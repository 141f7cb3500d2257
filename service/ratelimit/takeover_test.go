package ratelimit

import (
	"fmt"
	"os"
	"testing"
	"time"

	crl "github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// smallKeyTakeoverCases: the shape of faulttest TestEnvoyOwnerKill's busy
// key on the simulated clock: a 200/s token bucket, one token a request,
// two clients (the two nodes that did not own the key), offered 1.5× and
// 5×; the owner dies at 3 s, a new one starts after an election's length
// and the clients reach it over the next 100 ms, or (as on real nodes,
// where one survivor learns the new leader late) over the next 2 s.
func smallKeyTakeoverCases() []namedCase {
	var out []namedCase
	for _, reconnect := range []time.Duration{100 * time.Millisecond, 2 * time.Second} {
		for _, offered := range []float64{1.5, 5} {
			for _, gap := range []time.Duration{200 * time.Millisecond, 900 * time.Millisecond} {
				for seed := uint64(1); seed <= 3; seed++ {
					c := simCase{strategy: crl.Lease, clients: 2, offered: offered, limit: 200, tokens: 1,
						warmup: 2 * time.Second, measure: 8 * time.Second, seed: seed,
						takeoverAt: 3 * time.Second, ownerGap: gap, reconnect: reconnect}
					out = append(out, namedCase{fmt.Sprintf("200/s %g× gap %v reconnect %v seed %d", offered, gap, reconnect, seed), c})
				}
			}
		}
	}
	return out
}

// TestSmallKeyTakeover: issue 37's bar for a busy 200/s token-bucket key
// whose owner dies: every 1-second window from a second after the death
// within 0.9–1.10× the limit, and no window of the run above 1.10×.
//
// Opt-in (TOLLGATE_TAKEOVER_BAR=1): it reproduces on the simulated clock
// the dip TestEnvoyOwnerKill measures on real processes, and fails on the
// current owner: the worst second after the death is 0.805–0.895× in 5 of
// the 12 cases with prompt clients (during the takeover guard) and
// 0.815–0.89× in 7 of the 12 with a late one, and a second reaches
// 1.11–1.26× in 3 cases (docs/ratelimits.md, takeover).
func TestSmallKeyTakeover(t *testing.T) {
	if os.Getenv("TOLLGATE_TAKEOVER_BAR") == "" {
		t.Skip("issue 37's takeover bar for a small busy key; fails on the current owner (docs/ratelimits.md); set TOLLGATE_TAKEOVER_BAR=1")
	}
	for _, nc := range smallKeyTakeoverCases() {
		c := nc.c
		r := runSim(t, c)
		win := c.maxWindowRatio(r)
		low, at := minWindowAfter(r.perMs, c.takeoverAt+time.Second-c.warmup)
		t.Logf("%s: most in a 1-s window %.3f×, from 1 s after the death ≥ %.3f× (window from %v after it)", nc.name, win, low/c.limit, at+time.Second)
		if win > 1.10 {
			t.Errorf("%s: a 1-second window admitted %.3f× the limit, want ≤ 1.10", nc.name, win)
		}
		if low < 0.9*c.limit {
			t.Errorf("%s: the 1-second window from %v after the owner died admitted %.3f× the limit, want ≥ 0.9", nc.name, at+time.Second, low/c.limit)
		}
	}
}
