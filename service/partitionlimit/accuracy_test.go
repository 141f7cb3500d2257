package partitionlimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
)

// serveHub serves h's Sketches service on a loopback port.
func serveHub(tb testing.TB, h *Hub) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	closing := make(chan struct{})
	g := grpc.NewServer()
	api.RegisterSketchesServer(g, NewService(h, closing))
	go func() { _ = g.Serve(lis) }()
	tb.Cleanup(func() { close(closing); g.Stop() })
	return lis.Addr().String()
}

type accuracyResult struct {
	n, p             int
	hub, client      float64
	relHub, relLocal float64 // relative errors
}

// runAccuracy drives `clients` real Limiters, each seeing a random subset
// (every series goes to each client with probability 0.3, and to one at
// least) of n distinct series in one partition, pushes their sketches over
// gRPC to a hub, and compares the hub's merged estimate, and one client's
// view after the hub streamed the merge back, with n.
func runAccuracy(tb testing.TB, n, p, clients int) accuracyResult {
	tb.Helper()
	h, err := New(Config{NodeID: "acc", Precision: p})
	if err != nil {
		tb.Fatal(err)
	}
	addr := serveHub(tb, h)
	lims := make([]*partitionlimit.Limiter, clients)
	for i := range lims {
		l, err := partitionlimit.New(partitionlimit.Config{Precision: p, Addrs: []string{addr}, PushInterval: time.Hour,
			Limits: partitionlimit.LimitsFunc(func(string) int64 { return math.MaxInt64 })})
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		lims[i] = l
	}
	r := rand.New(rand.NewPCG(uint64(n), uint64(p)))
	batches := make([][]uint64, clients)
	flushBatch := func(i int) {
		if err := lims[i].Check("acc", []partitionlimit.Series{{Partition: 7, Hashes: batches[i]}}); err != nil {
			tb.Fatal(err)
		}
		batches[i] = batches[i][:0]
	}
	for range n {
		h := r.Uint64()
		sent := false
		for i := range clients {
			if r.Float64() < 0.3 {
				batches[i] = append(batches[i], h)
				sent = true
			}
		}
		if !sent {
			i := r.IntN(clients)
			batches[i] = append(batches[i], h)
		}
		for i := range clients {
			if len(batches[i]) >= 1000 {
				flushBatch(i)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range clients {
		flushBatch(i)
		if err := lims[i].Flush(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	est, regs := h.Estimate("acc", 7)
	// The client's view converges to the hub's registers through the stream
	// (polling with a generous deadline: this catches a hang, it times nothing).
	deadline := time.Now().Add(time.Minute)
	for !slices.Equal(lims[0].WindowRegisters("acc", 7), regs) {
		if time.Now().After(deadline) {
			tb.Fatalf("n=%d p=%d: client 0 never received the merged sketch", n, p)
		}
		time.Sleep(10 * time.Millisecond)
	}
	local := lims[0].Estimate("acc", 7)
	return accuracyResult{n: n, p: p, hub: est, client: local,
		relHub: (est - float64(n)) / float64(n), relLocal: (local - float64(n)) / float64(n)}
}

// TestMergedAccuracy (the product rules/§9 bar): 10 clients with random subsets; the
// merged estimate, on the hub and as streamed back to a client, is within 3
// standard errors (1.04/√m) of the exact distinct count at 1e3, 1e5 and 1e6
// series, precisions 11 and 14. (1e7 is BenchmarkMergedAccuracy.) Seeds are
// fixed, so the test is deterministic.
func TestMergedAccuracy(t *testing.T) {
	sizes := []int{1_000, 100_000, 1_000_000}
	if testing.Short() {
		sizes = sizes[:2]
	}
	for _, p := range []int{11, 14} {
		for _, n := range sizes {
			res := runAccuracy(t, n, p, 10)
			bound := 3 * api.HLLStdError(p)
			t.Logf("p=%d n=%d: hub %.0f (%+.2f%%), client %.0f, 3σ = %.2f%%", p, n, res.hub, 100*res.relHub, res.client, 100*bound)
			if math.Abs(res.relHub) > bound {
				t.Errorf("p=%d n=%d: merged estimate %.0f, error %.2f%% beyond 3σ = %.2f%%", p, n, res.hub, 100*res.relHub, 100*bound)
			}
			if res.client != res.hub {
				t.Errorf("p=%d n=%d: client view %.0f differs from the hub's %.0f after the stream", p, n, res.client, res.hub)
			}
		}
	}
}

// BenchmarkMergedAccuracy prints the accuracy table of BENCHMARKS.md,
// including 10M series (too slow for the unit test). Run with -benchtime=1x.
func BenchmarkMergedAccuracy(b *testing.B) {
	sizes := []int{1_000, 100_000, 1_000_000, 10_000_000}
	for b.Loop() {
		for _, p := range []int{11, 14} {
			for _, n := range sizes {
				res := runAccuracy(b, n, p, 10)
				fmt.Fprintf(os.Stderr, "| %d | %d | %.0f | %+.2f%% | %.2f%% | %s |\n", p, n, res.hub, 100*res.relHub, 300*api.HLLStdError(p),
					map[bool]string{true: "yes", false: "NO"}[math.Abs(res.relHub) <= 3*api.HLLStdError(p)])
			}
		}
	}
}
