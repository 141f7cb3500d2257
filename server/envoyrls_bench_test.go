//go:build unix

package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
)

// BenchmarkEnvoyShouldRateLimit: one node (Linux: CPU time from getrusage), clients in the same process (so on
// the same cores) calling ShouldRateLimit over loopback gRPC on 4
// connections, 1, 2, 8 or 32 calls in flight (1 and 2 give the latency floor, 32 the throughput), one descriptor whose rule is 1,000,000/s
// (so the lease, not the limit, is on the path: every call is decided, most
// admitted). Reports decisions/s and the p50/p99 of a call as the client
// sees it.
//
//	go test -run '^$' -bench EnvoyShouldRateLimit -benchtime 100000x ./server
func BenchmarkEnvoyShouldRateLimit(b *testing.B) {
	s, err := New(Config{
		Node:    NodeConfig{ID: "n1", DataDir: b.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Cluster: ClusterConfig{Bootstrap: true},
		Raft:    RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	yaml := "domain: bench\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"
	resp, err := api.NewConfigClient(cc).ApplyLimits(ctx, &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{Envoy: map[string]string{"bench": yaml}}})
	if err != nil {
		b.Fatal(err)
	}
	for s.RuntimeConfig().Version < resp.Version {
		time.Sleep(10 * time.Millisecond)
	}
	const conns = 4
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range clients {
		c, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	req := rlsReq("bench", "api", "ingest")
	// Warm: the key's lease arrives within a report period or two.
	for range 50 {
		if _, err := clients[0].ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, inflight := range []int{1, 2, 8, 32} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) { benchRLS(ctx, b, clients, req, inflight) })
	}
	// Open loop: calls leave on a fixed schedule whatever the answers do, as
	// from many independent Envoys. A closed loop at saturation measures the
	// length of its own queue; this measures the latency at a stated rate.
	for _, rate := range []int{20000, 25000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { benchRLSOpen(ctx, b, clients, req, rate) })
	}
}

// benchRLSOpen sends b.N calls at rate per second. One dispatcher releases
// every call whose time has come (it sleeps between releases, so a late
// wake-up releases a small burst) to a pool of callers; a call's latency
// runs from its scheduled time, so a stall of the dispatcher, a caller or
// the node counts against every call it delayed (no coordinated omission).
func benchRLSOpen(ctx context.Context, b *testing.B, clients []rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, rate int) {
	const callers = 64
	interval := time.Second / time.Duration(rate)
	due := make(chan time.Time, b.N)
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			var l []time.Duration
			for at := range due {
				if _, err := c.ShouldRateLimit(ctx, req); err != nil {
					b.Error(err)
					return
				}
				l = append(l, time.Since(at))
			}
			lat[w] = l
		}()
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < b.N; {
		now := time.Now()
		for ; i < b.N; i++ {
			at := start.Add(time.Duration(i) * interval)
			if at.After(now) {
				time.Sleep(at.Sub(now))
				break
			}
			due <- at
		}
	}
	close(due)
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	reportLatencies(b, lat, el, cpu)
}

func benchRLS(ctx context.Context, b *testing.B, clients []rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, inflight int) {
	conns := len(clients)
	lat := make([][]time.Duration, inflight)
	var wg sync.WaitGroup
	per := b.N / inflight
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for w := range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%conns]
			l := make([]time.Duration, 0, per)
			for range per {
				t0 := time.Now()
				if _, err := c.ShouldRateLimit(ctx, req); err != nil {
					b.Error(err)
					return
				}
				l = append(l, time.Since(t0))
			}
			lat[w] = l
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	reportLatencies(b, lat, el, cpu)
}

// reportLatencies reports the calls' rate, p50 and p99 over the elapsed
// time, and decisions per CPU-second of the process (node and clients,
// whatever else the machine runs: the load-independent figure; × cores =
// what an idle machine sustains).
func reportLatencies(b *testing.B, lat [][]time.Duration, el, cpu time.Duration) {
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/el.Seconds(), "decisions/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(len(all))/cpu.Seconds(), "decisions/cpu-s")
}

// cpuTime is the user + system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
