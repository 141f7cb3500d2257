package rateowner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	crl "github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// simCase is one closed-loop run of N client cores against one owner core on a
// simulated clock: no I/O, no goroutines, deterministic for a seed.
type simCase struct {
	strategy crl.Strategy
	clients  int
	sticky   int     // 0: requests go to any client; k: only to the first k
	offered  float64 // × the limit
	limit    float64 // tokens/s
	burst    int64
	tokens   int // per request
	warmup   time.Duration
	measure  time.Duration
	latency  time.Duration // one way, report and update
	period   time.Duration
	seed     uint64
}

type simResult struct {
	admitted, offered float64 // tokens during the measured span
	rejectedFrac      float64
	final             ownerCounts // the owner's metrics at the end
}

func (c simCase) ratio(r simResult) float64 {
	return r.admitted / (c.limit * c.measure.Seconds())
}

type msg struct {
	at     int64
	client int
	rep    *api.RateReport
	upd    *api.RateUpdate
}

func runSim(t testing.TB, c simCase) simResult {
	t.Helper()
	if c.period == 0 {
		c.period = 100 * time.Millisecond
	}
	if c.tokens == 0 {
		c.tokens = 10
	}
	if c.latency == 0 {
		c.latency = time.Millisecond
	}
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	rng := rand.New(rand.NewPCG(c.seed, 42))
	owner := New(Config{Period: c.period}, 64, 4, func(string) (float64, int64) { return c.limit, c.burst })
	lims := make([]*crl.Limiter, c.clients)
	states := make([]*crl.ReportState, c.clients)
	sess := make([]*Session, c.clients)
	offset := make([]time.Duration, c.clients)
	for i := range lims {
		l, err := crl.NewLimiter(crl.LimiterConfig{Strategy: c.strategy, Now: clock, ClientID: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		lims[i], states[i], sess[i] = l, crl.NewReportState(), owner.NewSession()
		offset[i] = time.Duration(rng.Int64N(int64(c.period/time.Millisecond))) * time.Millisecond
		// Every client announces itself (as the transport's heartbeat does),
		// so the owner counts it active for the Local strategy.
		l.Allow("t", 0)
	}
	const tenant = "t"
	step := time.Millisecond
	reqPerSec := c.offered * c.limit / float64(c.tokens)
	var inflight []msg
	var res simResult
	var rejected, total float64
	end := c.warmup + c.measure
	start := now
	all := func(int) bool { return true }
	for el := time.Duration(0); el < end; el += step {
		now = start.Add(el)
		ns := now.UnixNano()
		// deliver messages due
		keep := inflight[:0]
		for _, m := range inflight {
			if m.at > ns {
				keep = append(keep, m)
				continue
			}
			if m.rep != nil {
				if err := sess[m.client].Absorb(m.rep, now); err != nil {
					t.Fatal(err)
				}
			} else if _, err := lims[m.client].Apply(m.upd, now); err != nil {
				t.Fatal(err)
			}
		}
		inflight = keep
		// reports
		for i, l := range lims {
			if el%c.period == offset[i]%c.period {
				l.Tick(now)
				inflight = append(inflight, msg{at: ns + int64(c.latency), client: i, rep: l.Report(states[i], nil)})
			}
		}
		// owner tick
		if el%c.period == 0 {
			owner.Tick(now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
			for i, s := range sess {
				if u := s.Take(); u != nil {
					inflight = append(inflight, msg{at: ns + int64(c.latency), client: i, upd: u})
				}
			}
		}
		_ = all
		// traffic
		k := poisson(rng, reqPerSec*step.Seconds())
		for range k {
			n := c.clients
			if c.sticky > 0 {
				n = c.sticky
			}
			ok := lims[rng.IntN(n)].Allow(tenant, c.tokens)
			if el >= c.warmup {
				total += float64(c.tokens)
				if ok {
					res.admitted += float64(c.tokens)
				} else {
					rejected += float64(c.tokens)
				}
			}
		}
	}
	res.offered = total
	res.final = owner.counts(now.UnixNano())
	if total > 0 {
		res.rejectedFrac = rejected / total
	}
	return res
}

func poisson(r *rand.Rand, mean float64) int {
	l := math.Exp(-mean)
	k, p := 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// TestLeaseGoals checks the Lease strategy against the bars on the
// simulated clock: ≤ 1.05× at 5× offered, ≥ 0.95× with 4 sticky clients of
// 60 at offered ≥ the limit, < 0.5% rejected at 0.8×.
func TestLeaseGoals(t *testing.T) {
	for _, n := range []int{10, 60} {
		for _, sticky := range []int{0, 4} {
			for _, x := range []float64{0.8, 1, 2, 5} {
				c := simCase{strategy: crl.Lease, clients: n, sticky: sticky, offered: x, limit: 10000, tokens: 10,
					warmup: 2 * time.Second, measure: 4 * time.Second, seed: uint64(n) + uint64(10*x)}
				r := runSim(t, c)
				got := c.ratio(r)
				name := fmt.Sprintf("N=%d sticky=%d offered=%.1f×", n, sticky, x)
				if got > 1.05 {
					t.Errorf("%s: admitted %.3f× the limit, want ≤ 1.05", name, got)
				}
				if x >= 1 && got < 0.95 {
					t.Errorf("%s: admitted %.3f× the limit, want ≥ 0.95", name, got)
				}
				if x < 1 && r.rejectedFrac >= 0.005 {
					t.Errorf("%s: %.2f%% rejected, want < 0.5%%", name, 100*r.rejectedFrac)
				}
			}
		}
	}
}

// TestOwnerLimitedMetrics: the owner's "limited" gauges count a tenant
// offered 5× its limit, with its window rate at the limit, and not a tenant
// offered half of it.
func TestOwnerLimitedMetrics(t *testing.T) {
	over := simCase{strategy: crl.Lease, clients: 10, offered: 5, limit: 10000, tokens: 10,
		warmup: time.Second, measure: 2 * time.Second, seed: 9}
	f := runSim(t, over).final
	if f.owned != 1 || f.limited != 1 || f.limitedLimit != 10000 {
		t.Fatalf("at 5×: owned %d, limited %d, limit %.0f; want 1, 1, 10000", f.owned, f.limited, f.limitedLimit)
	}
	if r := f.limitedRate / f.limitedLimit; r < 0.9 || r > 1.1 {
		t.Errorf("at 5×: window rate %.0f/s is %.3f× the limit, want within 0.9–1.1", f.limitedRate, r)
	}
	under := over
	under.offered = 0.5
	if f := runSim(t, under).final; f.owned != 1 || f.limited != 0 || f.limitedRate != 0 {
		t.Errorf("at 0.5×: owned %d, limited %d, rate %.0f; want 1, 0, 0", f.owned, f.limited, f.limitedRate)
	}
}

// TestBaselineAndLocalWeaknesses pins what the issue says of the peers, so the
// simulation keeps measuring something real: the blocklist baseline misses the
// limit at 1× (a block lasts until the window decays, then clients admit
// everything until the next update; here it under-admits), and the classic local strategy admits about 4/60 of the limit when
// 4 of 60 clients carry the traffic.
func TestBaselineAndLocalWeaknesses(t *testing.T) {
	base := simCase{strategy: crl.Blocklist, clients: 60, offered: 1, limit: 10000, tokens: 10,
		warmup: 2 * time.Second, measure: 4 * time.Second, seed: 3}
	if got := base.ratio(runSim(t, base)); got > 0.97 {
		t.Errorf("blocklist at 1×: admitted %.3f×; the blocklist scheme should miss the limit (< 0.97)", got)
	}
	loc := simCase{strategy: crl.Local, clients: 60, sticky: 4, offered: 2, limit: 10000, tokens: 10,
		warmup: 2 * time.Second, measure: 4 * time.Second, seed: 4}
	if got := loc.ratio(runSim(t, loc)); got < 0.05 || got > 0.1 {
		t.Errorf("local, 4 sticky of 60 at 2×: admitted %.3f×, want ≈ 4/60", got)
	}
	loc.sticky = 0
	if got := loc.ratio(runSim(t, loc)); math.Abs(got-1) > 0.05 {
		t.Errorf("local, random over 60 at 2×: admitted %.3f×, want ≈ 1", got)
	}
}
