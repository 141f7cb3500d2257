package faulttest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/layout"
)

// TestEnvoyRaiseMovesOwners: Envoy traffic at 5× the limit of keys whose
// partitions a raise 4 → 8 moves to new groups (two of the 200/s token
// bucket, two of the 20/s sliding window), round-robin over the three nodes,
// while the raise runs. Each move changes the keys' rate owner (the new
// group's leader takes them over as after a leader change), so every key is
// taken over once, by a live owner, with its old owner still answering.
// Counted per 1-s window of the answers' arrival, in 100-ms steps, from 2 s
// after the load starts: every window within 0.9–1.10× of the limit, and no
// error answer.
//
// Opt-in (TOLLGATE_ENVOY_RAISE=1): a measurement on real processes
// (BENCHMARKS.md), as TestEnvoyOwnerKill.
func TestEnvoyRaiseMovesOwners(t *testing.T) {
	if os.Getenv("TOLLGATE_ENVOY_RAISE") == "" {
		t.Skip("measures rate owners moved by a raise on real processes (BENCHMARKS.md); set TOLLGATE_ENVOY_RAISE=1")
	}
	const offered = 5.0
	idx := envoyrl.NewIndex(map[string]*envoyrl.Config{"kill": mustEnvoyConfig(t, envoyKillConfig)})
	c := newCluster(t, defaultClusterOptions())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := api.NewConfigClient(c.conn(c.nodes[0].grpcAddr)).ApplyLimits(ctx, &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{Envoy: map[string]string{"kill": envoyKillConfig}}}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	target := layout.RaiseTarget(api.DefaultPartitions, groups, 2*groups)
	type keyLoad struct {
		rule, value string
		limit       float64
		from, to    int // rate group before and after the raise
		req         *rlsv3.RateLimitRequest
		mu          sync.Mutex
		admitted    []time.Duration
		errors      int
	}
	var keys []*keyLoad
	for _, r := range []struct {
		rule  string
		limit float64
	}{{"busy", 200}, {"owned", 20}} {
		n := 0
		for i := 0; n < 2; i++ {
			v := fmt.Sprintf("v%d", i)
			entries := []envoyrl.Entry{{Key: r.rule, Value: v}}
			rule, _ := idx.Match("kill", entries)
			if rule == nil {
				t.Fatal("no rule matches")
			}
			ck := envoyrl.CounterKey(rule, entries)
			part := api.RatePartition(ck, api.DefaultPartitions)
			if target[part] < groups {
				continue
			}
			n++
			keys = append(keys, &keyLoad{rule: r.rule, value: v, limit: r.limit, from: api.RateGroup(ck, api.DefaultPartitions, groups), to: target[part],
				req: &rlsv3.RateLimitRequest{Domain: "kill", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: r.rule, Value: v}}}}}})
		}
	}
	var clients []rlsv3.RateLimitServiceClient
	for _, n := range c.nodes {
		clients = append(clients, rlsv3.NewRateLimitServiceClient(c.conn(n.grpcAddr)))
	}
	waitUntil(t, "every node decides with the Envoy config", func() bool {
		for _, cl := range clients {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			resp, err := cl.ShouldRateLimit(rctx, keys[0].req)
			rcancel()
			if err != nil || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
				return false
			}
		}
		return true
	})
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, k := range keys {
		paceEnvoy(ctx, &wg, stop, start, offered*k.limit, clients, k.req, func(at time.Duration, kind int) {
			k.mu.Lock()
			defer k.mu.Unlock()
			switch kind {
			case 0:
				k.admitted = append(k.admitted, at)
			case 2:
				k.errors++
			}
		})
	}
	loadFor(4 * time.Second)
	raiseAt := time.Since(start)
	for {
		actx, acancel := adminCtx(ctx, 10*time.Second)
		_, err := c.admin(c.nodes[0]).RaiseGroups(actx, &api.RaiseGroupsRequest{To: 2 * groups})
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("raise to %d: %v", 2*groups, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitUntil(t, "the raise's moves to finish", func() bool {
		pm := c.partitionMoves(ctx)
		return pm != nil && pm.GetPending() == 0 && pm.GetGroups() == 2*groups
	})
	doneAt := time.Since(start)
	loadFor(6 * time.Second)
	end := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("raise 4 → 8 at %v, moves done %v later", raiseAt.Round(time.Millisecond), (doneAt - raiseAt).Round(time.Millisecond))
	for _, k := range keys {
		sort.Slice(k.admitted, func(i, j int) bool { return k.admitted[i] < k.admitted[j] })
		count := func(from time.Duration) int {
			i := sort.Search(len(k.admitted), func(i int) bool { return k.admitted[i] >= from })
			j := sort.Search(len(k.admitted), func(j int) bool { return k.admitted[j] >= from+time.Second })
			return j - i
		}
		low, high := 1<<30, 0
		var lowAt, highAt time.Duration
		for s := 2 * time.Second; s+time.Second <= end-time.Second; s += 100 * time.Millisecond {
			n := count(s)
			if n < low {
				low, lowAt = n, s
			}
			if n > high {
				high, highAt = n, s
			}
		}
		var perSec []int
		for s := raiseAt - 2*time.Second; s+time.Second <= end-time.Second; s += time.Second {
			perSec = append(perSec, count(s))
		}
		t.Logf("%s=%s (%g/s, %g× offered over 3 nodes, group %d → %d): per second from 2 s before the raise %v; least in a second %.2f× (at %v after the raise), most %.2f× (at %v); %d errors",
			k.rule, k.value, k.limit, offered, k.from, k.to, perSec, float64(low)/k.limit, (lowAt - raiseAt).Round(time.Millisecond),
			float64(high)/k.limit, (highAt - raiseAt).Round(time.Millisecond), k.errors)
		if float64(high) > 1.10*k.limit || float64(low) < 0.9*k.limit || k.errors > 0 {
			t.Errorf("%s=%s: a 1-s window outside 0.9–1.10× of %g (%d to %d), or %d errors", k.rule, k.value, k.limit, low, high, k.errors)
		}
	}
}
