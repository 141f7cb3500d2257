package server

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
)

// BenchmarkShareModeThroughput compares the hot path with movable shares and
// with the static split in the same run: two real nodes (4 raft groups on
// raft-boltdb, gRPC on loopback) side by side, one per mode, driven in
// alternating rounds (the order flips every round so neither always runs
// first). Per round and mode: "new" sends 120 requests of 500 new series
// (random partitions) from 4 concurrent senders; "refresh" moves the node's
// clock one minute on and re-sends the series of its first "new" round, so
// each is logged as a refresh. The tenant's limit is far away (the common
// path: the share is looked up but nothing is borrowed; borrowing near the
// limit is measured by BenchmarkFalseRejections' p99). Reports per mode and
// kind the median over rounds of series/s and the p50/p99 request latency
// over all requests, and movable/static ratios. Run:
//
//	go test ./server -run '^$' -bench ShareModeThroughput -benchtime 1x -v
func BenchmarkShareModeThroughput(b *testing.B) {
	const (
		rounds  = 15
		reqs    = 120
		perReq  = 500
		senders = 4
	)
	type node struct {
		mode   string
		s      *Server
		c      api.TrackerClient
		cc     *grpc.ClientConn
		offset atomic.Int64 // clock offset in minutes
		pool   [][]uint64   // the first new round's requests (partition in pool[i][0])
		rng    *rand.Rand
	}
	type series struct {
		rates map[string][]float64
		lats  map[string][]time.Duration
	}
	res := map[string]*series{}
	var nodes []*node
	modes := []string{ShareStatic, ShareMovable}
	if os.Getenv("SHARES_MOVABLE_FIRST") != "" {
		modes = []string{ShareMovable, ShareStatic} // placement check: which node is created first
	}
	for _, mode := range modes {
		n := &node{mode: mode, rng: rand.New(rand.NewPCG(42, uint64(len(nodes))))}
		dir := b.TempDir()
		lim := dir + "/limits.yaml"
		if err := os.WriteFile(lim, []byte("tenants:\n  bench:\n    max_series: 100000000\n"), 0o644); err != nil {
			b.Fatal(err)
		}
		s, err := New(Config{
			Node:    NodeConfig{ID: "n-" + mode, DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
			Cluster: ClusterConfig{Bootstrap: true},
			Raft:    RaftConfig{Addr: "127.0.0.1:0"},
			Shares:  SharesConfig{Mode: mode},
			Limits:  LimitsConfig{File: lim},
			Clock:   ClockConfig{Now: func() time.Time { return time.Now().Add(time.Duration(n.offset.Load()) * time.Minute) }},
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
		n.s = s
		if n.cc, err = grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth); err != nil {
			b.Fatal(err)
		}
		n.c = api.NewTrackerClient(n.cc)
		nodes = append(nodes, n)
		res[mode] = &series{rates: map[string][]float64{}, lats: map[string][]time.Duration{}}
	}
	defer func() {
		for _, n := range nodes {
			n.cc.Close()
			_ = n.s.Stop(context.Background())
		}
	}()

	// send runs the requests from `senders` goroutines; it returns series/s
	// and the request latencies.
	send := func(n *node, batch [][]uint64) (float64, []time.Duration) {
		var next atomic.Int64
		var mu sync.Mutex
		var lats []time.Duration
		var wg sync.WaitGroup
		t0 := time.Now()
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var my []time.Duration
				for {
					i := int(next.Add(1)) - 1
					if i >= len(batch) {
						break
					}
					part := int(batch[i][0])
					t1 := time.Now()
					resp, err := n.c.TrackSeries(context.Background(), &api.TrackSeriesRequest{Tenant: "bench", Partition: uint32(part), Hashes: batch[i][1:]})
					if err != nil {
						b.Errorf("%s: track: %v", n.mode, err)
						return
					}
					my = append(my, time.Since(t1))
					if len(resp.RejectedHashes) > 0 {
						b.Errorf("%s: %d series rejected far below the limit", n.mode, len(resp.RejectedHashes))
						return
					}
				}
				mu.Lock()
				lats = append(lats, my...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return float64(len(batch)*perReq) / time.Since(t0).Seconds(), lats
	}
	for round := range rounds {
		order := slices.Clone(nodes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, kind := range []string{"new", "refresh"} {
			for _, n := range order {
				var batch [][]uint64
				if kind == "new" {
					for range reqs {
						part := n.rng.IntN(64)
						batch = append(batch, append([]uint64{uint64(part)}, hashesIn(n.rng.Uint64(), part, perReq)...))
					}
					if n.pool == nil {
						n.pool = batch
					}
				} else {
					n.offset.Add(1)
					batch = n.pool
				}
				rate, lats := send(n, batch)
				if round == 0 {
					continue // warm-up
				}
				res[n.mode].rates[kind] = append(res[n.mode].rates[kind], rate)
				res[n.mode].lats[kind] = append(res[n.mode].lats[kind], lats...)
			}
		}
	}
	med := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	pct := func(l []time.Duration, p int) time.Duration {
		l = slices.Clone(l)
		slices.Sort(l)
		return l[len(l)*p/100]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "| kind | static series/s (median of %d rounds) | movable series/s | movable/static (medians) | movable/static (median of per-round pairs) | static p50 / p99 | movable p50 / p99 | p99 movable/static |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", rounds-1)
	for _, kind := range []string{"new", "refresh"} {
		st, mv := res[ShareStatic], res[ShareMovable]
		sr, mr := med(st.rates[kind]), med(mv.rates[kind])
		s99, m99 := pct(st.lats[kind], 99), pct(mv.lats[kind], 99)
		// A round's two runs are back to back, so their ratio cancels most
		// of the load other processes put on the machine meanwhile.
		var pairs []float64
		for i := range st.rates[kind] {
			pairs = append(pairs, mv.rates[kind][i]/st.rates[kind][i])
		}
		fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.3f | %.3f | %v / %v | %v / %v | %.3f |\n", kind, sr, mr, mr/sr, med(pairs),
			pct(st.lats[kind], 50).Round(10*time.Microsecond), s99.Round(10*time.Microsecond),
			pct(mv.lats[kind], 50).Round(10*time.Microsecond), m99.Round(10*time.Microsecond), float64(m99)/float64(s99))
		b.ReportMetric(med(pairs), kind+"-movable/static")
	}
	// The only per-request difference between the modes when nothing is
	// borrowed: the share lookup, once per (tenant, batch) in Decide.
	for _, n := range nodes {
		share := n.s.shares.Share(0)
		const calls = 1_000_000
		t0 := time.Now()
		var sink int64
		for range calls {
			sink += share("bench")
		}
		fmt.Fprintf(&sb, "\n%s share lookup: %.0f ns/call (share %d)", n.mode, float64(time.Since(t0).Nanoseconds())/calls, sink/calls)
	}
	b.Log("\n" + sb.String())
}
