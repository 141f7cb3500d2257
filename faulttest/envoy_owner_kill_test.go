package faulttest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
)

// envoyKillConfig: a busy per-second rule (a token bucket, leases) and a
// per-second rule of at most 50 (a sliding window: every request decided by
// the owner).
const envoyKillConfig = `
domain: kill
descriptors:
  - key: busy
    rate_limit: {unit: second, requests_per_unit: 200}
  - key: owned
    rate_limit: {unit: second, requests_per_unit: 20}
`

// TestEnvoyOwnerKill: Envoy traffic at 150% of a per-second limit goes to
// the two nodes that do not own the key; the owner (the leader of the key's
// rate group) is SIGKILLed. Counted per 1-second window of the answers'
// arrival (when Envoy lets a request through): no window across the kill admits more than 1.10× the limit,
// and once a survivor leads the group (plus a second for the nodes to reach
// it) every window admits at least 0.9×. The windows from the first second
// after the kill, the election included, are logged: the bar
// (≥ 0.9× from then) is a measurement here, the election's length depends
// on the machine.
//
// Opt-in (TOLLGATE_ENVOY_KILL=1): it measures issue 37's bar on real
// processes rather than gating CI (a loaded machine's round trips shorten
// windows without a kill). On the 2-core VM with nothing else running, at
// 5× offered, every window from the kill admitted 0.93–0.99× of the 200/s
// key (at most 1.06×) and 0.90–0.95× of the 20/s key (at most 1.00×),
// since a held ask asks for the owner's round at once and nodes report to
// a new leader as soon as they learn of it (docs/envoy.md; before, the 20/s
// key's windows from the kill were 0.60–0.95×).
// TOLLGATE_ENVOY_KILL_TRACE=1 logs the answers per 100 ms around the kill.
func TestEnvoyOwnerKill(t *testing.T) {
	if os.Getenv("TOLLGATE_ENVOY_KILL") == "" {
		t.Skip("measures issue 37's failover bar on real processes (docs/envoy.md); set TOLLGATE_ENVOY_KILL=1")
	}
	// TOLLGATE_ENVOY_KILL_OFFERED: the load as a multiple of the limit
	// (default 1.5; the bar is at 5).
	offered := 1.5
	if v := os.Getenv("TOLLGATE_ENVOY_KILL_OFFERED"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 20) {
			t.Fatalf("TOLLGATE_ENVOY_KILL_OFFERED=%q: want a multiple of the limit in (0, 20]", v)
		}
		offered = f
	}
	idx := envoyrl.NewIndex(map[string]*envoyrl.Config{"kill": mustEnvoyConfig(t, envoyKillConfig)})
	c := newCluster(t, defaultClusterOptions())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := api.NewConfigClient(c.conn(c.nodes[0].grpcAddr)).ApplyLimits(ctx, &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{Envoy: map[string]string{"kill": envoyKillConfig}}}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	for _, tc := range []struct {
		key   string
		limit float64
	}{{"busy", 200}, {"owned", 20}} {
		t.Run(tc.key, func(t *testing.T) {
			entries := []envoyrl.Entry{{Key: tc.key, Value: "v"}}
			r, _ := idx.Match("kill", entries)
			if r == nil {
				t.Fatal("no rule matches")
			}
			g := api.RateGroup(envoyrl.CounterKey(r, entries), api.DefaultPartitions, api.DefaultGroups)
			owner := c.waitLeader(g, nil)
			var survivors []rlsv3.RateLimitServiceClient
			for _, n := range c.nodes {
				if n != owner {
					survivors = append(survivors, rlsv3.NewRateLimitServiceClient(c.conn(n.grpcAddr)))
				}
			}
			req := &rlsv3.RateLimitRequest{Domain: "kill", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: tc.key, Value: "v"}}}}}
			// Every node decides with the config once a request is
			// answered with the rule's limit.
			waitUntil(t, "the survivors decide with the Envoy config", func() bool {
				for _, s := range survivors {
					rctx, rcancel := context.WithTimeout(ctx, time.Second)
					resp, err := s.ShouldRateLimit(rctx, req)
					rcancel()
					if err != nil || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
						return false
					}
				}
				return true
			})

			// 150% of the limit, paced by elapsed time, round-robin over
			// the survivors, each request on its own goroutine (a call
			// that waits for an election must not hold back the others).
			var mu sync.Mutex
			var admitted []time.Duration
			// answers: every answer's arrival and kind (0 admitted, 1
			// over the limit, 2 an error), for TOLLGATE_ENVOY_KILL_TRACE.
			type answer struct {
				at   time.Duration
				kind int
			}
			var answers []answer
			start := time.Now()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			// With TOLLGATE_ENVOY_KILL_TRACE, the key's owner over the run
			// (polled every 100 ms): an owner change besides the kill (a
			// leadership hand-off, the restart of the node a previous
			// subtest killed) shows here.
			var owners []string
			trace := os.Getenv("TOLLGATE_ENVOY_KILL_TRACE") != ""
			if trace {
				wg.Add(1)
				go func() {
					defer wg.Done()
					last := ""
					for {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						id := "none"
						if l, term := c.leaderOf(g); l != nil {
							id = fmt.Sprintf("%s(term %d)", l.id, term)
						}
						if id != last {
							last = id
							mu.Lock()
							owners = append(owners, fmt.Sprintf("%v:%s", time.Since(start).Round(10*time.Millisecond), id))
							mu.Unlock()
						}
					}
				}()
			}
			paceEnvoy(ctx, &wg, stop, start, offered*tc.limit, survivors, req, func(at time.Duration, kind int) {
				mu.Lock()
				answers = append(answers, answer{at, kind})
				if kind == 0 {
					// When Envoy would let the request through: the
					// answer's arrival (a request sent during the
					// election is decided when it ends).
					admitted = append(admitted, at)
				}
				mu.Unlock()
			})
			loadFor(5 * time.Second)
			killAt := time.Since(start)
			owner.kill(t)
			newOwner := c.waitLeader(g, owner)
			ledAt := time.Since(start)
			loadFor(8 * time.Second)
			end := time.Since(start)
			close(stop)
			wg.Wait()
			owner.restart(t)
			sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
			if trace {
				t.Logf("%s: the key's owner from the start (kill at %v): %s", tc.key, killAt.Round(10*time.Millisecond), strings.Join(owners, " "))
				var tenths []string // admitted per 100 ms from the start
				for from := time.Duration(0); from < end; from += 100 * time.Millisecond {
					n := 0
					for _, a := range admitted {
						if a >= from && a < from+100*time.Millisecond {
							n++
						}
					}
					tenths = append(tenths, strconv.Itoa(n))
				}
				t.Logf("%s: admitted per 100 ms from the start: %s", tc.key, strings.Join(tenths, " "))
				// Per 100 ms from 300 ms before the kill: admitted /
				// over the limit / errors.
				var line []string
				for from := killAt - 300*time.Millisecond; from < killAt+2*time.Second; from += 100 * time.Millisecond {
					var n [3]int
					for _, a := range answers {
						if a.at >= from && a.at < from+100*time.Millisecond {
							n[a.kind]++
						}
					}
					line = append(line, fmt.Sprintf("%v:%d/%d/%d", (from-killAt).Round(time.Millisecond), n[0], n[1], n[2]))
				}
				t.Logf("%s: per 100 ms around the kill (admitted/over/errors): %s", tc.key, strings.Join(line, " "))
			}

			count := func(from time.Duration) int {
				i := sort.Search(len(admitted), func(i int) bool { return admitted[i] >= from })
				j := sort.Search(len(admitted), func(j int) bool { return admitted[j] >= from+time.Second })
				return j - i
			}
			// Windows in 100 ms steps, ending 1 s before the traffic
			// stops (calls still in flight then are not counted).
			scan := func(from, to time.Duration) (low, high int, lowAt, highAt time.Duration) {
				low = 1 << 30
				for s := from; s+time.Second <= to; s += 100 * time.Millisecond {
					n := count(s)
					if n < low {
						low, lowAt = n, s
					}
					if n > high {
						high, highAt = n, s
					}
				}
				return
			}
			steady, _, _, _ := scan(2*time.Second, killAt)
			_, high, _, highAt := scan(2*time.Second, end-time.Second)
			lowKill, _, lowKillAt, _ := scan(killAt+time.Second, end-time.Second)
			lowFrom, _, lowFromAt, _ := scan(killAt, end-time.Second)
			reached := ledAt + time.Second
			low, _, lowAt, _ := scan(reached, end-time.Second)
			var perSec []int
			for s := killAt - 2*time.Second; s+time.Second <= end-time.Second; s += time.Second {
				perSec = append(perSec, count(s))
			}
			t.Logf("%s (%g/s, %g× offered to 2 survivors): killed %s at %v, %s led the group %v later; per second from 2 s before the kill %v;"+
				" before the kill ≥ %.2f×; most in a second %.2f× (at %v after the kill); from the kill ≥ %.2f× (at %v after it); from 1 s after the kill ≥ %.2f× (at %v after it); from 1 s after the new leader ≥ %.2f× (at %v after the kill)",
				tc.key, tc.limit, offered, owner.id, killAt.Round(time.Millisecond), newOwner.id, (ledAt - killAt).Round(time.Millisecond), perSec,
				float64(steady)/tc.limit, float64(high)/tc.limit, (highAt - killAt).Round(time.Millisecond),
				float64(lowFrom)/tc.limit, (lowFromAt - killAt).Round(time.Millisecond),
				float64(lowKill)/tc.limit, (lowKillAt - killAt).Round(time.Millisecond), float64(low)/tc.limit, (lowAt - killAt).Round(time.Millisecond))
			if float64(high) > 1.10*tc.limit {
				t.Errorf("%d admitted in the second from %v (kill at %v), want ≤ 1.10× %g", high, highAt, killAt, tc.limit)
			}
			if float64(low) < 0.9*tc.limit {
				t.Errorf("%d admitted in the second from %v, %v after the new leader; want ≥ 0.9× %g", low, lowAt, lowAt-ledAt, tc.limit)
			}
		})
	}
}

func mustEnvoyConfig(t *testing.T, yaml string) *envoyrl.Config {
	t.Helper()
	cfg, err := envoyrl.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// paceEnvoy sends req at rate a second from start, paced by elapsed time and
// round-robin over clients, each request on its own goroutine (a call that
// waits for an election must not hold back the others), until stop closes.
// record gets each answer's arrival since start and its kind: 0 admitted, 1
// over the limit, 2 an error. wg counts the sender and every call.
func paceEnvoy(ctx context.Context, wg *sync.WaitGroup, stop <-chan struct{}, start time.Time, rate float64, clients []rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, record func(at time.Duration, kind int)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			for due := int(rate * time.Since(start).Seconds()); sent < due; sent++ {
				cl := clients[sent%len(clients)]
				wg.Add(1)
				go func() {
					defer wg.Done()
					rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
					defer rcancel()
					resp, err := cl.ShouldRateLimit(rctx, req)
					kind := 2
					if err == nil {
						kind = 1
						if resp.OverallCode == rlsv3.RateLimitResponse_OK {
							kind = 0
						}
					}
					record(time.Since(start), kind)
				}()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
}
