package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
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
	// onOff > 0: traffic is offered for onOff, then none for onOff, and so
	// on, starting on at time 0.
	onOff time.Duration
	// takeoverAt > 0: the owner dies then (its in-flight messages are lost);
	// a new owner starts ownerGap later, and each client reaches it after a
	// further random delay in [0, reconnect) on a new stream.
	takeoverAt, ownerGap, reconnect time.Duration
	// churn > 0: every churnEvery, churn clients (at random) are replaced
	// by new ones (new ids, new streams).
	churn      int
	churnEvery time.Duration
	// lowerAt > 0: the limit (and a default burst with it) halves then.
	lowerAt time.Duration
}

type simResult struct {
	admitted, offered float64 // tokens during the measured span
	rejectedFrac      float64
	final             ownerCounts // the owner's metrics at the end
	// maxWindow is the most admitted in any 1-second window of the measured
	// span (1 ms steps), tokens; onAdmitted is what the on phases admitted
	// (onOff), over onSpan of on time.
	maxWindow, onAdmitted float64
	onSpan                time.Duration
	perMs                 []float64 // admitted per millisecond of the measured span
}

// maxWindowRatio is the largest 1-second window's admission ÷ the limit.
func (c simCase) maxWindowRatio(r simResult) float64 { return r.maxWindow / c.limit }

func (c simCase) ratio(r simResult) float64 {
	return r.admitted / (c.limit * c.measure.Seconds())
}

type msg struct {
	at     int64
	client int
	gen    int // the client's stream generation (takeover)
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
	curLimit := c.limit
	limits := func(string) (float64, int64) { return curLimit, c.burst }
	owner := mustNew(t, Config{Period: c.period}, 64, 4, limits)
	lims := make([]*crl.Limiter, c.clients)
	states := make([]*crl.ReportState, c.clients)
	sess := make([]*Session, c.clients)
	gen := make([]int, c.clients)
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
	// Takeover: when each client reaches the new owner.
	var rejoin []time.Duration
	if c.takeoverAt > 0 {
		rejoin = make([]time.Duration, c.clients)
		for i := range rejoin {
			rejoin[i] = c.takeoverAt + c.ownerGap
			if c.reconnect > 0 {
				rejoin[i] += time.Duration(rng.Int64N(int64(c.reconnect/time.Millisecond))) * time.Millisecond
			}
		}
	}
	const tenant = "t"
	step := time.Millisecond
	reqPerSec := c.offered * c.limit / float64(c.tokens)
	var inflight []msg
	var traceAdm [2]float64
	var res simResult
	var rejected, total float64
	end := c.warmup + c.measure
	start := now
	perMs := make([]float64, 0, int(c.measure/step))
	nextID := uint64(c.clients)
	for el := time.Duration(0); el < end; el += step {
		now = start.Add(el)
		ns := now.UnixNano()
		if c.lowerAt > 0 && el == c.lowerAt {
			curLimit = c.limit / 2
		}
		if c.churn > 0 && el > 0 && el%c.churnEvery == 0 && owner != nil {
			for range c.churn {
				i := rng.IntN(c.clients)
				nextID++
				l, err := crl.NewLimiter(crl.LimiterConfig{Strategy: c.strategy, Now: clock, ClientID: nextID})
				if err != nil {
					t.Fatal(err)
				}
				if sess[i] != nil {
					sess[i].Close()
				}
				lims[i], states[i], sess[i] = l, crl.NewReportState(), owner.NewSession()
				gen[i]++
				l.Allow("t", 0)
			}
		}
		if c.takeoverAt > 0 {
			switch {
			case el == c.takeoverAt:
				owner, inflight = nil, nil
				for i := range sess {
					sess[i] = nil
				}
			case el == c.takeoverAt+c.ownerGap:
				owner = mustNew(t, Config{Period: c.period}, 64, 4, limits)
			}
			for i, at := range rejoin {
				if el == at {
					sess[i], states[i] = owner.NewSession(), crl.NewReportState()
					gen[i]++
				}
			}
		}
		// deliver messages due
		keep := inflight[:0]
		for _, m := range inflight {
			if m.at > ns {
				keep = append(keep, m)
				continue
			}
			if m.gen != gen[m.client] {
				continue // sent on a stream that no longer exists
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
				if sess[i] != nil {
					inflight = append(inflight, msg{at: ns + int64(c.latency), client: i, gen: gen[i], rep: l.Report(states[i], nil)})
				}
			}
		}
		// owner tick
		if el%c.period == 0 && owner != nil {
			owner.Tick(now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
			if simTrace && c.takeoverAt > 0 && el >= c.takeoverAt-time.Second && el <= c.takeoverAt+5*time.Second {
				traceTick(t, owner, sess, el-c.takeoverAt, ns, traceAdm)
			}
			traceAdm = [2]float64{}
			for i, s := range sess {
				if s == nil {
					continue
				}
				if u := s.Take(); u != nil {
					inflight = append(inflight, msg{at: ns + int64(c.latency), client: i, gen: gen[i], upd: u})
				}
			}
		}
		// traffic
		on := c.onOff == 0 || (el/c.onOff)%2 == 0
		var admittedNow float64
		if on {
			k := poisson(rng, reqPerSec*step.Seconds())
			for range k {
				n := c.clients
				if c.sticky > 0 {
					n = c.sticky
				}
				ci := rng.IntN(n)
				ok := lims[ci].Allow(tenant, c.tokens)
				if ok && ci < 2 {
					traceAdm[ci] += float64(c.tokens)
				}
				if el >= c.warmup {
					total += float64(c.tokens)
					if ok {
						admittedNow += float64(c.tokens)
					} else {
						rejected += float64(c.tokens)
					}
				}
			}
		}
		if el >= c.warmup {
			res.admitted += admittedNow
			perMs = append(perMs, admittedNow)
			if on {
				res.onAdmitted += admittedNow
				res.onSpan += step
			}
		}
	}
	res.perMs = perMs
	res.offered = total
	if owner != nil {
		res.final = owner.counts(now.UnixNano())
	}
	if total > 0 {
		res.rejectedFrac = rejected / total
	}
	win := int(time.Second / step)
	var sum float64
	for i, v := range perMs {
		sum += v
		if i >= win {
			sum -= perMs[i-win]
		}
		res.maxWindow = max(res.maxWindow, sum)
	}
	return res
}

// simTrace (TOLLGATE_SIM_TRACE=1): a takeover case logs the owner's view of
// its tenant every tick from a second before the death to 5 s after it (the
// bucket, the grants, each client's cap beyond its reported consumption and
// guard rate, and what the first two clients admitted since the last tick).
// With TOLLGATE_SIM_CASE naming one case, it is how the takeover guard was
// tuned.
var simTrace = os.Getenv("TOLLGATE_SIM_TRACE") != ""

// traceTick logs one tick of the owner's view of the simulated tenant.
func traceTick(t testing.TB, owner *Owner, sess []*Session, sinceDeath time.Duration, ns int64, admitted [2]float64) {
	ts := owner.lookup("t")
	if ts == nil {
		return
	}
	var caps []string
	for i, s := range sess {
		if s == nil {
			continue
		}
		for _, es := range s.entries {
			for _, e := range es {
				if e.t == ts {
					caps = append(caps, fmt.Sprintf("%d: cap-consumed %d guard %.0f/s", i, int64(e.cap)-int64(e.lastConsumed), e.guardRate))
				}
			}
		}
	}
	t.Logf("trace %5dms: level %7.1f avail %6.1f guarding %v scarce %v demand %6.1f last second %6.1f admitted %v clients %v",
		sinceDeath.Milliseconds(), ts.level, ts.avail, ts.guarding, ts.scarce, ts.sumDemand, ts.recentSince(ns-int64(time.Second)), admitted, caps)
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

// TestLeaseChange holds the Lease strategy to its bars under change, on the
// simulated clock (60 clients, limit 10,000 tokens/s, 10-token requests,
// three seeds each): steady 5× offered, and 10 of the 60 clients replaced
// every 2 s, within 0.98–1.02× of the limit; 5×
// for 2 s then nothing for 2 s, no 1-second window above 1.10× and the on
// phases at ≥ 0.95×; a burst of a tenth of a second at 5× offered ≥ 0.95×;
// an owner that dies and a new one that starts 1.5 s later (clients reach it
// over 300 ms) or 200 ms later (clients reach it over a second), no 1-second
// window above 1.10× and, from the first second after it died, none below
// 0.9×; the limit halved, from a second later within
// 0.98–1.02× of the new limit and no 1-second window above 1.10× of it.
// Before the change the on/off case reached 1.87×, the
// small burst 0.79× and the takeovers 1.30× and 1.80×.
func TestLeaseChange(t *testing.T) {
	for _, nc := range leaseChangeCases() {
		c := nc.c
		r := runSim(t, c)
		got, win := c.ratio(r), c.maxWindowRatio(r)
		switch {
		case c.lowerAt > 0:
			// From 1 s after the change, against the new limit.
			after := r.perMs[(c.lowerAt+time.Second-c.warmup)/time.Millisecond:]
			var sum, win, maxWin float64
			for i, v := range after {
				sum += v
				win += v
				if i >= 1000 {
					win -= after[i-1000]
				}
				maxWin = max(maxWin, win)
			}
			newLimit := c.limit / 2
			mean := sum / (newLimit * float64(len(after)) / 1000)
			if maxWin/newLimit > 1.10 || mean < 0.98 || mean > 1.02 {
				t.Errorf("%s: after the limit halved, max 1-second window %.3f×, mean %.3f× the new limit; want ≤ 1.10 and 0.98–1.02",
					nc.name, maxWin/newLimit, mean)
			}
		case c.takeoverAt > 0:
			if win > 1.10 {
				t.Errorf("%s: a 1-second window admitted %.3f× the limit, want ≤ 1.10", nc.name, win)
			}
			// No dip: from the first second after the owner died (the
			// new one starts up to 1.5 s later), every 1-second window
			// admits at least 0.9× the limit.
			if low, at := minWindowAfter(r.perMs, c.takeoverAt+time.Second-c.warmup); low < 0.9*c.limit {
				t.Errorf("%s: the 1-second window from %v after the owner died admitted %.3f× the limit, want ≥ 0.9", nc.name, at+time.Second, low/c.limit)
			}
		case c.onOff > 0:
			on := r.onAdmitted / (c.limit * r.onSpan.Seconds())
			if win > 1.10 || on < 0.95 {
				t.Errorf("%s: max 1-second window %.3f×, on phases %.3f×; want ≤ 1.10 and ≥ 0.95", nc.name, win, on)
			}
		case c.burst > 0:
			if got < 0.95 {
				t.Errorf("%s: admitted %.3f× the limit, want ≥ 0.95", nc.name, got)
			}
		default:
			if got < 0.98 || got > 1.02 {
				t.Errorf("%s: admitted %.3f× the limit, want 0.98–1.02", nc.name, got)
			}
		}
	}
}

// TestLeaseChangeReport prints the change scenarios' figures (go test -v).
func TestLeaseChangeReport(t *testing.T) {
	if !testing.Verbose() {
		t.Skip("prints figures only with -v; TestLeaseChange asserts them")
	}
	for _, c := range leaseChangeCases() {
		r := runSim(t, c.c)
		t.Logf("%-40s admitted %.3f× maxwin %.3f× on-mean %.3f× rej %.1f%%", c.name, c.c.ratio(r), c.c.maxWindowRatio(r),
			r.onAdmitted/(c.c.limit*r.onSpan.Seconds()), 100*r.rejectedFrac)
		if c.c.takeoverAt > 0 {
			low, at := minWindowAfter(r.perMs, c.c.takeoverAt+time.Second-c.c.warmup)
			t.Logf("%-40s from 1 s after the owner died: min 1 s %.3f× (at %v after the kill)", "", low/c.c.limit, at+time.Second)
		}
	}
}

// minWindowAfter is the fewest tokens admitted in a 1-second window (1 ms
// steps) of perMs starting at from or later, and that window's start.
func minWindowAfter(perMs []float64, from time.Duration) (float64, time.Duration) {
	i0 := int(from / time.Millisecond)
	low, lowAt := math.Inf(1), from
	var sum float64
	for i := i0; i < len(perMs); i++ {
		sum += perMs[i]
		if i-i0 >= 1000 {
			sum -= perMs[i-1000]
		}
		if i-i0 >= 999 && sum < low {
			low, lowAt = sum, time.Duration(i-999)*time.Millisecond
		}
	}
	return low, lowAt - from
}

// maxWindowAt is the most admitted in a 1-second window of perMs and where
// that window starts (from the measured span's start).
func maxWindowAt(perMs []float64) (float64, time.Duration) {
	var high, sum float64
	var at time.Duration
	for i := range perMs {
		sum += perMs[i]
		if i >= 1000 {
			sum -= perMs[i-1000]
		}
		if i >= 999 && sum > high {
			high, at = sum, time.Duration(i-999)*time.Millisecond
		}
	}
	return high, at
}

type namedCase struct {
	name string
	c    simCase
}

func leaseChangeCases() []namedCase {
	var out []namedCase
	for seed := uint64(1); seed <= 3; seed++ {
		base := simCase{strategy: crl.Lease, clients: 60, offered: 5, limit: 10000, tokens: 10, warmup: 2 * time.Second,
			measure: 6 * time.Second, seed: seed}
		out = append(out, namedCase{fmt.Sprintf("steady 5× seed %d", seed), base})
		churn := base
		churn.churn, churn.churnEvery = 10, 2*time.Second
		out = append(out, namedCase{fmt.Sprintf("churn 10 of 60 every 2s, 5× seed %d", seed), churn})
		onoff := base
		onoff.onOff = 2 * time.Second
		onoff.measure = 12 * time.Second
		out = append(out, namedCase{fmt.Sprintf("on/off 2s 5× seed %d", seed), onoff})
		onoffSmall := onoff
		onoffSmall.burst = 1000
		out = append(out, namedCase{fmt.Sprintf("on/off 2s 5× burst limit/10 seed %d", seed), onoffSmall})
		small := base
		small.burst = 1000
		out = append(out, namedCase{fmt.Sprintf("burst limit/10 5× seed %d", seed), small})
		lower := base
		lower.lowerAt = 4 * time.Second
		out = append(out, namedCase{fmt.Sprintf("limit halved at 4s, 5× seed %d", seed), lower})
		take := base
		take.takeoverAt, take.ownerGap, take.reconnect = 3*time.Second, 1500*time.Millisecond, 300*time.Millisecond
		out = append(out, namedCase{fmt.Sprintf("takeover 5× seed %d", seed), take})
		take2 := take
		take2.ownerGap, take2.reconnect = 200*time.Millisecond, time.Second
		out = append(out, namedCase{fmt.Sprintf("takeover fast, slow clients seed %d", seed), take2})
	}
	return out
}

// TestLeaseLargeRequests: three clients, requests of 200 tokens against a
// limit of 4,000/s with a burst of 400 (a lease per period is 133 tokens a
// client: less than a request), offered 3×, on the simulated clock: no
// 1-second window above rate + burst (1.10×), and at least 0.80× admitted.
// Before grants were capped at rate + burst per second while saturated, the
// carried remainders reached 1.15× (and 1.10×, 1.15× for seeds 2 and 3;
// 0.90–1.01× admitted; three remote-write gateways, the same shape, in
// gateway.TestThreeGatewaysThreeNodes). The cap costs admissions here: the
// folds it counts lag the admissions by up to a period (0.83–0.87×).
func TestLeaseLargeRequests(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		c := simCase{strategy: crl.Lease, clients: 3, offered: 3, limit: 4000, burst: 400, tokens: 200,
			warmup: 2 * time.Second, measure: 6 * time.Second, seed: seed}
		r := runSim(t, c)
		got, win := c.ratio(r), c.maxWindowRatio(r)
		t.Logf("seed %d: admitted %.3f×, most in a 1-s window %.3f×", seed, got, win)
		if win > 1.10 {
			t.Errorf("seed %d: %.3f× the limit in a 1-s window, want ≤ 1.10 (rate + burst)", seed, win)
		}
		if got < 0.80 {
			t.Errorf("seed %d: admitted %.3f× the limit, want ≥ 0.80", seed, got)
		}
	}
}
