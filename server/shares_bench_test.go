package server

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
)

// BenchmarkFalseRejections fills fresh tenants with random new series to a
// fraction of their max_series on a real node (4 raft groups on raft-boltdb,
// gRPC on loopback), once with movable shares and once with the static split,
// and reports the share of series rejected below the limit (at 100%: sent =
// limit, so every rejection is false; afterwards 1% more are sent and must all
// be rejected). Run:
//
//	go test ./server -run '^$' -bench FalseRejections -benchtime 1x
//
// The table goes to the log (-v) and to $SHARES_TABLE when set.
func BenchmarkFalseRejections(b *testing.B) {
	limits := []int64{100, 1000, 10_000, 150_000}
	fills := []float64{0.80, 0.90, 0.95, 0.99, 1.00}
	type cell struct {
		sent, rejected, accepted, beyond, beyondAccepted int64
		lats                                             []time.Duration
	}
	results := map[string]map[int64]map[float64]*cell{}
	for _, mode := range []string{ShareStatic, ShareMovable} {
		results[mode] = map[int64]map[float64]*cell{}
		dir := b.TempDir()
		s, err := New(Config{
			Node:    NodeConfig{ID: "n1", DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
			Cluster: ClusterConfig{Bootstrap: true},
			Raft:    RaftConfig{NoSync: false, Addr: "127.0.0.1:0"},
			Shares:  SharesConfig{Mode: mode},
			Limits:  LimitsConfig{File: writeLimits(b, dir, limits)},
			Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := s.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
		if err != nil {
			b.Fatal(err)
		}
		c := api.NewTrackerClient(cc)
		for _, lim := range limits {
			results[mode][lim] = map[float64]*cell{}
			for fi, f := range fills {
				tenant := fmt.Sprintf("l%d-f%d", lim, fi)
				n := int64(float64(lim) * f)
				r := rand.New(rand.NewPCG(uint64(lim), uint64(fi)))
				ce := &cell{sent: n}
				ce.rejected, ce.lats = fillRandom(b, c, tenant, r, n)
				ce.accepted = n - ce.rejected
				if f == 1 {
					ce.beyond = max(1, lim/100)
					rej, _ := fillRandom(b, c, tenant, r, ce.beyond)
					ce.beyondAccepted = ce.beyond - rej
				}
				results[mode][lim][f] = ce
			}
		}
		cc.Close()
		if err := s.Stop(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "| limit | fill | static: rejected below limit | movable: rejected below limit | movable accepted (at 100%%: +1%% beyond) | movable request p99 |\n|---:|---:|---:|---:|---:|---:|\n")
	worst := 0.0
	for _, lim := range limits {
		for _, f := range fills {
			st, mv := results[ShareStatic][lim][f], results[ShareMovable][lim][f]
			pct := func(c *cell) string {
				return fmt.Sprintf("%d / %d (%.3f%%)", c.rejected, c.sent, 100*float64(c.rejected)/float64(c.sent))
			}
			acc := fmt.Sprint(mv.accepted)
			if f == 1 {
				acc = fmt.Sprintf("%d (+%d of %d beyond)", mv.accepted, mv.beyondAccepted, mv.beyond)
			}
			fmt.Fprintf(&sb, "| %d | %.0f%% | %s | %s | %s | %s |\n", lim, f*100, pct(st), pct(mv), acc, p99(mv.lats))
			worst = max(worst, float64(mv.rejected)/float64(mv.sent))
		}
	}
	b.Log("\n" + sb.String())
	b.ReportMetric(worst*100, "worst-movable-%rejected")
	if p := os.Getenv("SHARES_TABLE"); p != "" {
		_ = os.WriteFile(p, []byte(sb.String()), 0o644)
	}
}

func p99(l []time.Duration) string {
	if len(l) == 0 {
		return "-"
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[len(l)*99/100].Round(10 * time.Microsecond).String()
}

func writeLimits(b *testing.B, dir string, limits []int64) string {
	var sb strings.Builder
	sb.WriteString("tenants:\n")
	for _, lim := range limits {
		for fi := range 5 {
			fmt.Fprintf(&sb, "  l%d-f%d:\n    max_series: %d\n", lim, fi, lim)
		}
	}
	p := dir + "/limits.yaml"
	if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// fillRandom sends n random new series of tenant from 8 concurrent senders,
// each request ≤ 20 series of one partition (so small tenants get many
// requests and the last series race for the last headroom).
func fillRandom(b *testing.B, c api.TrackerClient, tenant string, r *rand.Rand, n int64) (int64, []time.Duration) {
	const senders = 8
	batch := int64(max(1, min(20, n/200)))
	var next, rejected atomic.Int64
	var mu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	seeds := make([]uint64, senders)
	for i := range seeds {
		seeds[i] = r.Uint64()
	}
	for w := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := rand.New(rand.NewPCG(seeds[w], 3))
			var my []time.Duration
			for {
				k := min(batch, n-next.Add(batch)+batch)
				if k <= 0 {
					break
				}
				part := rr.IntN(64)
				hs := hashesIn(rr.Uint64(), part, int(k))
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := c.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(part), Hashes: hs})
				cancel()
				if err != nil {
					b.Errorf("track: %v", err)
					return
				}
				my = append(my, time.Since(t0))
				rejected.Add(int64(len(resp.RejectedHashes)))
			}
			mu.Lock()
			lats = append(lats, my...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return rejected.Load(), lats
}
