package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// BenchmarkSketchConvergence measures the sketches' convergence bar: 3 real
// nodes, 10 clients pushing every second (each to a node of its own choice,
// failing over to the others); per round every client adds 1,000 new series
// to one partition, then the time until each client's window registers equal
// the union of all clients' (the merged state) is recorded. After `rounds`
// rounds the first node is stopped and the rounds repeat. Reports median and
// max per phase. Run:
//
//	go test ./integration -run '^$' -bench SketchConvergence -benchtime 1x
func BenchmarkSketchConvergence(b *testing.B) {
	const clients, rounds = 10, 10
	limits := filepath.Join(b.TempDir(), "limits.yaml")
	if err := os.WriteFile(limits, []byte("defaults:\n  max_series_per_partition: 0\ntenants:\n  conv:\n    max_series_per_partition: 1000000\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		c := servertest.Start(b, servertest.Options{Nodes: 3, Configure: func(_ int, cfg *server.Config) { cfg.Limits.File = limits }})
		// Every node has measured both peers (so gossip lists them): the
		// hubs exchange sketches from the first round on.
		for deadline := time.Now().Add(60 * time.Second); ; {
			ok := true
			for _, s := range c.Nodes() {
				n := 0
				for _, p := range s.Status().Clock.Peers {
					if p.Error == "" {
						n++
					}
				}
				ok = ok && n == 2
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the nodes do not see each other")
			}
			time.Sleep(20 * time.Millisecond)
		}
		addrs := c.GRPCAddrs()
		lims := make([]*partitionlimit.Limiter, clients)
		for i := range lims {
			l, err := partitionlimit.New(partitionlimit.Config{Addrs: slices.Clone(addrs), PushInterval: time.Second, RPCTimeout: 500 * time.Millisecond,
				ReconnectMax: 200 * time.Millisecond, Limits: partitionlimit.LimitsFunc(func(string) int64 { return 1 << 40 })})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			lims[i] = l
		}
		r := rand.New(rand.NewPCG(7, 7))
		phase := func(name string) {
			var lat []time.Duration
			for range rounds {
				for _, l := range lims {
					hs := make([]uint64, 1000)
					for k := range hs {
						hs[k] = r.Uint64()
					}
					if err := l.Check("conv", []partitionlimit.Series{{Partition: 5, Hashes: hs}}); err != nil {
						b.Fatal(err)
					}
				}
				t0 := time.Now()
				target := make([]uint8, 2048)
				for _, l := range lims {
					for i, v := range l.WindowRegisters("conv", 5) {
						target[i] = max(target[i], v)
					}
				}
				done := make([]time.Duration, clients)
				for left := clients; left > 0; {
					if time.Since(t0) > 30*time.Second {
						b.Fatalf("%s: %d clients did not converge within 30s", name, left)
					}
					for i, l := range lims {
						if done[i] == 0 && slices.Equal(l.WindowRegisters("conv", 5), target) {
							done[i] = time.Since(t0)
							left--
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
				lat = append(lat, done...)
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			med, mx := lat[len(lat)/2], lat[len(lat)-1]
			b.ReportMetric(float64(med.Milliseconds()), name+"-p50-ms")
			b.ReportMetric(float64(mx.Milliseconds()), name+"-max-ms")
			fmt.Fprintf(os.Stderr, "%s: %d samples, median %v, max %v\n", name, len(lat), med, mx)
		}
		phase("3nodes")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = c.Stop(ctx, 0)
		cancel()
		phase("after-stop")
		unreach := 0
		for _, l := range lims {
			if st := l.Stats(); st.Remote == partitionlimit.RemoteUnreachable {
				unreach++
			}
		}
		if unreach > 0 {
			b.Fatalf("%d clients report the remote unreachable with two nodes up", unreach)
		}
	}
}
