package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	crl "github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// ogCase: a 200/s token-bucket key, 2 lease clients, an owner that dies,
// on the simulated clock, with the knobs that real processes add to
// runSim's clean world.
type ogCase struct {
	offered   float64
	limit     float64
	seed      uint64
	killAt    time.Duration // from the start
	gap       time.Duration // the new owner's first tick comes gap after the kill (its ticks keep the period's phase + gap)
	reach     [2]time.Duration
	latency   time.Duration // one way, base
	repJitter time.Duration // extra per report, U[0, repJitter) (in order per client)
	updJitter time.Duration // extra per update, U[0, updJitter) (in order per client)
	// firstRep: extra delay of a client's first report on its new stream
	// (connection setup): the report's counts are as of its build time.
	firstRep [2]time.Duration
	// burstEvery > 0: requests arrive in batches every burstEvery (same
	// mean), as a load generator that wakes every few ms, or stalls.
	burstEvery time.Duration
	// tickJitter: each owner tick is late by U[0, tickJitter).
	tickJitter time.Duration
	// clientPhase: each client's report offset in the period (ms); <0: random.
	clientPhase [2]int
	ownerPhase  time.Duration // the new owner's tick offset within the period
	end         time.Duration
}

type ogResult struct {
	perMs     []float64 // admitted per ms from the start
	perClient [2][]float64
	kill      int // index of the kill in perMs
	trace     []string
}

func runOG(t testing.TB, c ogCase) ogResult {
	t.Helper()
	period := 100 * time.Millisecond
	if c.latency == 0 {
		c.latency = time.Millisecond
	}
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	rng := rand.New(rand.NewPCG(c.seed, 42))
	jit := rand.New(rand.NewPCG(c.seed, 7))
	limits := func(string) (float64, int64) { return c.limit, 0 }
	owner := mustNew(t, Config{Period: period}, 64, 4, limits)
	const n = 2
	var lims [n]*crl.Limiter
	var states [n]*crl.ReportState
	var sess [n]*Session
	var gen [n]int
	var offset [n]time.Duration
	var lastAt [n]int64 // in-order delivery per client and direction
	var lastUpdAt [n]int64
	var firstPending [n]bool
	for i := range n {
		l, err := crl.NewLimiter(crl.LimiterConfig{Strategy: crl.Lease, Now: clock, ClientID: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		lims[i], states[i], sess[i] = l, crl.NewReportState(), owner.NewSession()
		if c.clientPhase[i] >= 0 {
			offset[i] = time.Duration(c.clientPhase[i]) * time.Millisecond
		} else {
			offset[i] = time.Duration(rng.Int64N(100)) * time.Millisecond
		}
		l.Allow("t", 0)
	}
	rejoin := [n]time.Duration{c.killAt + c.gap + c.reach[0], c.killAt + c.gap + c.reach[1]}
	var inflight []msg
	start := now
	var res ogResult
	res.kill = int(c.killAt / time.Millisecond)
	reqPerSec := c.offered * c.limit
	var pending float64 // batched arrivals
	nextTick, tickBase := time.Duration(0), time.Duration(0)
	newOwnerAt := c.killAt + c.gap
	var ownerTickAdm [n]float64
	for el := time.Duration(0); el < c.end; el += time.Millisecond {
		now = start.Add(el)
		ns := now.UnixNano()
		switch {
		case el == c.killAt:
			owner, inflight = nil, nil
			for i := range sess {
				sess[i] = nil
			}
		case el == newOwnerAt:
			owner = mustNew(t, Config{Period: period}, 64, 4, limits)
			tickBase = el + c.ownerPhase
			nextTick = tickBase
		}
		for i, at := range rejoin {
			if el == at {
				sess[i], states[i] = owner.NewSession(), crl.NewReportState()
				gen[i]++
				firstPending[i] = true
			}
		}
		keep := inflight[:0]
		for _, m := range inflight {
			if m.at > ns {
				keep = append(keep, m)
				continue
			}
			if m.gen != gen[m.client] {
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
		for i, l := range lims {
			if el%period == offset[i]%period {
				l.Tick(now)
				if sess[i] != nil {
					at := ns + int64(c.latency)
					if c.repJitter > 0 {
						at += jit.Int64N(int64(c.repJitter))
					}
					if firstPending[i] {
						at += int64(c.firstRep[i])
						firstPending[i] = false
					}
					at = max(at, lastAt[i])
					lastAt[i] = at
					inflight = append(inflight, msg{at: at, client: i, gen: gen[i], rep: l.Report(states[i], nil)})
				}
			}
		}
		if owner != nil && el == nextTick {
			owner.Tick(now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
			if ts := owner.lookup("t"); ts != nil && el >= c.killAt-300*time.Millisecond && el <= c.killAt+1500*time.Millisecond {
				var caps []string
				for i, s := range sess {
					if s == nil || s.entries == nil {
						continue
					}
					for _, es := range s.entries {
						for _, e := range es {
							if e.t == ts {
								caps = append(caps, fmt.Sprintf("%d:cap+%d g%.0f", i, int64(e.cap)-int64(e.lastConsumed), e.guardRate))
							}
						}
					}
				}
				var true09 float64
				for _, v := range res.perMs[max(0, len(res.perMs)-900):] {
					true09 += v
				}
				res.trace = append(res.trace, fmt.Sprintf("tick %+5dms level %6.1f avail %5.1f guard %-5v takeover %-5v recent(0.9s) %5.1f true(0.9s) %5.1f adm %v %v",
					(el-c.killAt).Milliseconds(), ts.level, ts.avail, ts.guarding, ts.takeover, ts.recentSince(ns+int64(period)-int64(time.Second)), true09, ownerTickAdm, caps))
			}
			ownerTickAdm = [n]float64{}
			for i, s := range sess {
				if s == nil {
					continue
				}
				if u := s.Take(); u != nil {
					at := ns + int64(c.latency)
					if c.updJitter > 0 {
						at += jit.Int64N(int64(c.updJitter))
					}
					at = max(at, lastUpdAt[i])
					lastUpdAt[i] = at
					inflight = append(inflight, msg{at: at, client: i, gen: gen[i], upd: u})
				}
			}
			tickBase += period
			nextTick = tickBase
			if c.tickJitter > 0 {
				nextTick += time.Duration(jit.Int64N(int64(c.tickJitter/time.Millisecond))) * time.Millisecond
			}
		}
		// traffic
		var k int
		if c.burstEvery > 0 {
			pending += reqPerSec / 1000
			if el%c.burstEvery == 0 {
				k = int(pending)
				pending -= float64(k)
			}
		} else {
			k = poisson(rng, reqPerSec/1000)
		}
		var adm float64
		var per [n]float64
		for range k {
			ci := rng.IntN(n)
			if lims[ci].Allow("t", 1) {
				adm++
				per[ci]++
				ownerTickAdm[ci]++
			}
		}
		res.perMs = append(res.perMs, adm)
		for i := range n {
			res.perClient[i] = append(res.perClient[i], per[i])
		}
	}
	return res
}

// windows: the most and least admitted in a 1-s window starting in
// [from, to) (ms indices), and where.
func ogWindows(perMs []float64, from, to int) (hi float64, hiAt int, lo float64, loAt int) {
	lo = 1e18
	for s := from; s < to && s+1000 <= len(perMs); s++ {
		var sum float64
		for _, v := range perMs[s : s+1000] {
			sum += v
		}
		if sum > hi {
			hi, hiAt = sum, s
		}
		if sum < lo {
			lo, loAt = sum, s
		}
	}
	return
}

func per100(perMs []float64, from, to int) []float64 {
	var out []float64
	for i := from; i+100 <= to; i += 100 {
		var s float64
		for _, v := range perMs[i : i+100] {
			s += v
		}
		out = append(out, s)
	}
	return out
}

func ogDefault() ogCase {
	return ogCase{offered: 5, limit: 200, seed: 1, killAt: 6 * time.Second, gap: 50 * time.Millisecond,
		reach: [2]time.Duration{30 * time.Millisecond, 60 * time.Millisecond}, clientPhase: [2]int{-1, -1},
		end: 10 * time.Second}
}

func (c ogCase) summary(t testing.TB, name string, r ogResult) (hi, lo float64) {
	k := r.kill
	hi, hiAt, _, _ := ogWindows(r.perMs, k-1000, k+2000)
	_, _, lo, loAt := ogWindows(r.perMs, k, len(r.perMs)-1000)
	pre, _, _, _ := ogWindows(r.perMs, 3000, k-1000)
	var first400 float64
	for _, v := range r.perMs[k : k+400] {
		first400 += v
	}
	t.Logf("%s: steady max %.3f×; across the kill max %.3f× (window from %+dms), from the kill min %.3f× (from %+dms); first 400 ms after the kill %.0f (rate: %.0f); per 100 ms from -300: %v",
		name, pre/c.limit, hi/c.limit, hiAt-k, lo/c.limit, loAt-k, first400, 0.4*c.limit, per100(r.perMs, k-300, k+1500))
	if os.Getenv("OG_TRACE") != "" {
		t.Logf("  %s", strings.Join(r.trace, "\n  "))
	}
	return hi / c.limit, lo / c.limit
}

// TestLeaseTakeoverOverGrant: a 200/s token-bucket key leased to two
// clients at 5× its limit, its owner killed; the new owner's first tick comes
// 50 or 200 ms after the kill and the clients reach it 0–400 ms after that,
// over 20 seeds (120 runs). Issue 37's bar: every 1-s window across the kill
// admits at most 1.10× the limit, and every window from a second after it at
// least 0.9×.
//
// It failed in 79 of 120 runs (1.16× at worst) while the tick on which the
// guard ends, because every client's lease share has reported, kept the
// guard's carry of one period's refill whole (round.go): two periods' worth
// granted at once, on top of what the clients had admitted by extending their
// leases. OG_TRACE=1 logs the owner's ticks around the kill of the worst run.
func TestLeaseTakeoverOverGrant(t *testing.T) {
	var worst, least ogRun
	worst.ratio, least.ratio = 0, 9
	var over, under int
	for seed := uint64(1); seed <= 20; seed++ {
		for _, reach := range [][2]time.Duration{{30 * time.Millisecond, 60 * time.Millisecond}, {0, 150 * time.Millisecond}, {20 * time.Millisecond, 400 * time.Millisecond}} {
			for _, gap := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
				c := ogDefault()
				c.seed, c.reach, c.gap = seed, reach, gap
				r := runOG(t, c)
				k := r.kill
				hi, _, _, _ := ogWindows(r.perMs, k-1000, k+2000)
				_, _, lo, _ := ogWindows(r.perMs, k+1000, len(r.perMs)-1000)
				if hi/c.limit > 1.10+1e-9 {
					over++
				}
				if lo/c.limit < 0.9-1e-9 {
					under++
				}
				if hi/c.limit > worst.ratio {
					worst = ogRun{c, r, hi / c.limit}
				}
				if lo/c.limit < least.ratio {
					least = ogRun{c, r, lo / c.limit}
				}
			}
		}
	}
	worst.c.summary(t, fmt.Sprintf("worst across the kill (seed %d)", worst.c.seed), worst.r)
	if over > 0 {
		t.Errorf("%d of 120 runs admitted over 1.10× the limit in a 1-s window across the kill (at worst %.3f×)", over, worst.ratio)
	}
	if under > 0 {
		t.Errorf("%d of 120 runs admitted under 0.9× the limit in a 1-s window from 1 s after the kill (at least %.3f×)", under, least.ratio)
	}
}

// ogRun is one run of TestLeaseTakeoverOverGrant, kept for its report.
type ogRun struct {
	c     ogCase
	r     ogResult
	ratio float64
}
