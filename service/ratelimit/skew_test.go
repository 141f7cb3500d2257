package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	crl "github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// skewCase is a failover on the simulated clock: clients admit against owner
// A, then every client moves to a fresh owner B (new streams, so each client's
// first report carries its window bucket counts, from which B rebuilds the
// window). Each side reads its own wall clock: clientSkew and ownerSkew
// shift them from true time, everything else (periods, latency, traffic)
// follows true time, as a node whose wall clock is wrong while its monotonic
// clock is right.
type skewCase struct {
	strategy   crl.Strategy
	clientSkew []time.Duration // one per client
	ownerSkew  [2]time.Duration
	limit      float64
	burst      int64
	offered    float64 // × the limit
	before     time.Duration
	after      time.Duration
	seed       uint64
}

// runSkew returns the tokens admitted in the after span (from the failover).
func runSkew(t *testing.T, c skewCase) (admitted float64) {
	t.Helper()
	const period, latency, tokens = 100 * time.Millisecond, time.Millisecond, 10
	start := time.Unix(1_800_000_000, 0)
	now := start // true time
	rng := rand.New(rand.NewPCG(c.seed, 7))
	n := len(c.clientSkew)
	lims := make([]*crl.Limiter, n)
	states := make([]*crl.ReportState, n)
	sess := make([]*Session, n)
	limits := func(string) (float64, int64) { return c.limit, c.burst }
	owner := mustNew(t, Config{Period: period}, 64, 4, limits)
	for i := range lims {
		skew := c.clientSkew[i]
		l, err := crl.NewLimiter(crl.LimiterConfig{Strategy: c.strategy, Now: func() time.Time { return now.Add(skew) }, ClientID: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		lims[i], states[i], sess[i] = l, crl.NewReportState(), owner.NewSession()
		l.Allow("t", 0)
	}
	ownerSkew := c.ownerSkew[0]
	var inflight []msg
	reqPerSec := c.offered * c.limit / tokens
	for el := time.Duration(0); el < c.before+c.after; el += time.Millisecond {
		now = start.Add(el)
		if el == c.before {
			// Failover: B starts empty; in-flight messages of A's streams are lost.
			owner, ownerSkew, inflight = mustNew(t, Config{Period: period}, 64, 4, limits), c.ownerSkew[1], nil
			for i := range sess {
				states[i], sess[i] = crl.NewReportState(), owner.NewSession()
			}
		}
		ns := now.UnixNano()
		keep := inflight[:0]
		for _, m := range inflight {
			if m.at > ns {
				keep = append(keep, m)
				continue
			}
			if m.rep != nil {
				if err := sess[m.client].Absorb(m.rep, now.Add(ownerSkew)); err != nil {
					t.Fatal(err)
				}
			} else if _, err := lims[m.client].Apply(m.upd, now.Add(c.clientSkew[m.client])); err != nil {
				t.Fatal(err)
			}
		}
		inflight = keep
		for i, l := range lims {
			if el%period == time.Duration(i*7%100)*time.Millisecond {
				l.Tick(now.Add(c.clientSkew[i]))
				inflight = append(inflight, msg{at: ns + int64(latency), client: i, rep: l.Report(states[i], nil)})
			}
		}
		if el%period == 0 {
			owner.Tick(now.Add(ownerSkew), func(int) bool { return true }, func(int) (string, string) { return "", "" })
			for i, s := range sess {
				if u := s.Take(); u != nil {
					inflight = append(inflight, msg{at: ns + int64(latency), client: i, upd: u})
				}
			}
		}
		for range poisson(rng, reqPerSec/1000) {
			if lims[rng.IntN(n)].Allow("t", tokens) && el >= c.before {
				admitted += tokens
			}
		}
	}
	return admitted
}

// TestFailoverUnderClockSkew: what wrong wall clocks do to a rate limit
// across an owner failover. A client and an owner each measure the window on
// their own clock; what crosses between them is the client's window bucket
// counts in the report that seeds a new owner's window, placed by the
// bucket's age (a duration) rather than by its wall-clock start. With clocks
// within the bound (±500 ms) or far beyond it (±5 min, −30 min on a client
// or on the new owner), the new owner rebuilds the window from the clients'
// counts as it does with correct clocks:
//   - Lease: admitted in the 2 s after the failover ≤ the limit plus a
//     quarter of the burst (a lost seed gives a fresh burst on top), and
//     ≥ 0.8 × the limit.
//   - Blocklist (the baseline scheme, whose admitted traffic depends on
//     where in its bucket the owner is): within a tenth of a burst of the
//     range the same failovers give with correct clocks.
//
// Before the owner placed counts by age it matched bucket starts across the
// two clocks, and a skewed client or owner lost its seed: Lease admitted
// ~27,000 where the limit is 20,000.
func TestFailoverUnderClockSkew(t *testing.T) {
	const limit, burst = 10000.0, 10000 // window = burst ÷ limit = 1 s
	ms, minute := time.Millisecond, time.Minute
	cases := []struct {
		name   string
		client []time.Duration
		owner  [2]time.Duration
	}{
		{"correct clocks", []time.Duration{0, 0, 0, 0}, [2]time.Duration{0, 0}},
		{"clients within bound", []time.Duration{500 * ms, -500 * ms, 300 * ms, -300 * ms}, [2]time.Duration{0, 0}},
		{"new owner +500ms", []time.Duration{0, 0, 0, 0}, [2]time.Duration{0, 500 * ms}},
		{"new owner -500ms", []time.Duration{0, 0, 0, 0}, [2]time.Duration{0, -500 * ms}},
		{"clients +5min", []time.Duration{5 * minute, 5 * minute, 5 * minute, 5 * minute}, [2]time.Duration{0, 0}},
		{"new owner +5min", []time.Duration{0, 0, 0, 0}, [2]time.Duration{0, 5 * minute}},
		{"mixed beyond bound", []time.Duration{0, 5 * minute, -5 * minute, 250 * ms}, [2]time.Duration{-30 * minute, 5 * minute}},
	}
	phases := []time.Duration{3000 * ms, 3250 * ms, 3500 * ms, 3750 * ms}
	for _, strat := range []crl.Strategy{crl.Lease, crl.Blocklist} {
		lo, hi := math.Inf(1), math.Inf(-1) // correct clocks' range (cases[0] runs first)
		for _, tc := range cases {
			for _, at := range phases {
				c := skewCase{strategy: strat, clientSkew: tc.client, ownerSkew: tc.owner, limit: limit, burst: burst,
					offered: 3, before: at, after: 2 * time.Second, seed: uint64(at / ms)}
				got := runSkew(t, c)
				want := limit * c.after.Seconds()
				name := fmt.Sprintf("%v, %s, failover at %v", strat, tc.name, at)
				t.Logf("%s: admitted %.0f in the %v after it (limit × span %.0f)", name, got, c.after, want)
				if tc.name == "correct clocks" {
					lo, hi = min(lo, got), max(hi, got)
				}
				switch strat {
				case crl.Lease:
					if got > want+burst/4 || got < 0.8*want {
						t.Errorf("%s: admitted %.0f tokens in the %v after it, want within [%.0f, %.0f]", name, got, c.after, 0.8*want, want+burst/4)
					}
				default:
					if got > hi+burst/10 || got < lo-burst/10 {
						t.Errorf("%s: admitted %.0f tokens in the %v after it, want within a tenth of a burst of the correct clocks' [%.0f, %.0f]",
							name, got, c.after, lo, hi)
					}
				}
			}
		}
	}
}
