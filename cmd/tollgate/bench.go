package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

type benchOpts struct {
	addrs           string
	tenants         int
	seriesPerTenant int64
	newFraction     float64
	requestSize     int
	concurrency     int
	duration        time.Duration
	prefill         bool
	partitions      int
	groups          int
	seed            uint64
	timeout         time.Duration
	asJSON          bool
}

// BenchSummary is the final report (--json prints it).
type BenchSummary struct {
	DurationSec         float64 `json:"duration_s"`
	Requests            int64   `json:"requests"`
	SeriesSent          int64   `json:"series_sent"`
	SeriesPerSec        float64 `json:"series_per_sec"`
	NewSeriesPerSec     float64 `json:"new_series_per_sec"`
	RefreshSeriesPerSec float64 `json:"refresh_series_per_sec"`
	P50Ms               float64 `json:"p50_ms"`
	P90Ms               float64 `json:"p90_ms"`
	P99Ms               float64 `json:"p99_ms"`
	MaxMs               float64 `json:"max_ms"`
	Rejected            int64   `json:"rejected"`
	Errors              int64   `json:"errors"`
	Tenants             int     `json:"tenants"`
	RequestSize         int     `json:"request_size"`
	Concurrency         int     `json:"concurrency"`
	NewFraction         float64 `json:"new_fraction"`
}

func newBenchCmd() *cobra.Command {
	var o benchOpts
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load generator: track new and refreshed series against a cluster and report throughput and latency",
		Long: `Load generator. Each request carries --request-size hashes of one tenant and one
partition; a --new-fraction of them are series never sent before and the rest
re-send series already sent (refreshes). Series are generated deterministically
from (seed, tenant, partition, index), so --prefill (create --series-per-tenant
series per tenant before measuring) followed by --new-fraction 0 measures pure
refreshes. Progress goes to stderr each second; the summary to stdout.`,
		Example: `  tollgate bench --new-fraction 1 --duration 10s --json
  tollgate bench --prefill --series-per-tenant 200000 --new-fraction 0 --duration 10s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addrs, "addr", "127.0.0.1:7300", "comma-separated gRPC addresses")
	f.IntVar(&o.tenants, "tenants", 10, "number of tenants (bench-0 … bench-N)")
	f.Int64Var(&o.seriesPerTenant, "series-per-tenant", 1_000_000, "series universe per tenant: once a tenant created this many, it only refreshes")
	f.Float64Var(&o.newFraction, "new-fraction", 1, "fraction of each request that is new series (0 = refresh only)")
	f.IntVar(&o.requestSize, "request-size", 1000, "hashes per request")
	f.IntVar(&o.concurrency, "concurrency", 16, "concurrent requests in flight")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "measured duration")
	f.BoolVar(&o.prefill, "prefill", false, "create every tenant's series before measuring")
	f.IntVar(&o.partitions, "partitions", 64, "cluster partitions P")
	f.IntVar(&o.groups, "groups", 4, "cluster groups G")
	f.Uint64Var(&o.seed, "seed", 1, "series generator seed")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "per-request deadline")
	f.BoolVar(&o.asJSON, "json", false, "print the summary as JSON")
	return cmd
}

type benchState struct {
	o       benchOpts
	next    [][]atomic.Int64 // [tenant][partition] series created so far
	created []atomic.Int64   // per tenant
	tenants []string
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// hash is the k-th series of tenant t in partition p.
func (b *benchState) hash(t, p int, k int64) uint64 {
	first, last := api.PartitionHashRange(p, b.o.partitions)
	x := splitmix(b.o.seed*0x100000001b3 ^ uint64(t)<<40 ^ uint64(p)<<24 ^ uint64(k))
	width := last - first + 1
	if width == 0 {
		return x
	}
	return first + x%width
}

func runBench(ctx context.Context, o benchOpts, stdout, stderr io.Writer) error {
	if o.tenants < 1 || o.requestSize < 1 || o.concurrency < 1 || o.newFraction < 0 || o.newFraction > 1 || o.seriesPerTenant < 1 {
		return fmt.Errorf("bench: --tenants, --request-size, --concurrency, --series-per-tenant must be ≥ 1 and --new-fraction in [0,1]")
	}
	// ModeSync: the load generator measures the servers' answers (and needs no
	// near-limit polling); TrackPartition waits for them in any mode.
	c, err := clientlib.New(clientlib.Config{Addrs: strings.Split(o.addrs, ","), Partitions: o.partitions, Groups: o.groups, Mode: clientlib.ModeSync})
	if err != nil {
		return err
	}
	defer c.Close()
	b := &benchState{o: o, created: make([]atomic.Int64, o.tenants), next: make([][]atomic.Int64, o.tenants)}
	for t := range b.next {
		b.next[t] = make([]atomic.Int64, o.partitions)
		b.tenants = append(b.tenants, fmt.Sprintf("bench-%d", t))
	}
	if o.prefill {
		start := time.Now()
		if err := b.prefill(ctx, c); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "prefill: %d series in %.1fs\n", int64(o.tenants)*o.seriesPerTenant, time.Since(start).Seconds())
	}

	var (
		requests, sent, newSent, refreshSent, rejected, errs atomic.Int64
		latMu                                                sync.Mutex
		lats                                                 []float64
	)
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	start := time.Now()
	// The first few distinct error messages go to stderr, so an error count
	// in the summary always comes with its cause.
	var errMu sync.Mutex
	errSeen := map[string]bool{}
	reportErr := func(err error) {
		msg := err.Error()
		errMu.Lock()
		defer errMu.Unlock()
		if len(errSeen) < 5 && !errSeen[msg] {
			errSeen[msg] = true
			fmt.Fprintf(stderr, "error: %s\n", msg)
		}
	}
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(o.seed+uint64(w), uint64(w)))
			hashes := make([]uint64, 0, o.requestSize)
			var local []float64
			for i := 0; runCtx.Err() == nil; i++ {
				t := (w + i*o.concurrency) % o.tenants
				p := r.IntN(o.partitions)
				hashes = hashes[:0]
				nNew := int(math.Round(o.newFraction * float64(o.requestSize)))
				if b.created[t].Load() >= o.seriesPerTenant {
					nNew = 0
				}
				have := b.next[t][p].Load()
				if have == 0 {
					nNew = o.requestSize // nothing to refresh in this partition yet
				}
				if nNew > 0 {
					k0 := b.next[t][p].Add(int64(nNew)) - int64(nNew)
					b.created[t].Add(int64(nNew))
					for k := k0; k < k0+int64(nNew); k++ {
						hashes = append(hashes, b.hash(t, p, k))
					}
				}
				for len(hashes) < o.requestSize {
					hashes = append(hashes, b.hash(t, p, r.Int64N(have)))
				}
				// The request's deadline comes from ctx, not runCtx: requests in
				// flight when the run ends finish normally and are not counted,
				// instead of failing with DeadlineExceeded (the server's copy of
				// the deadline fires first, so such errors could not be told apart
				// from real ones).
				rctx, rcancel := context.WithTimeout(ctx, o.timeout)
				t0 := time.Now()
				rej, err := c.TrackPartition(rctx, b.tenants[t], p, hashes)
				d := time.Since(t0)
				rcancel()
				if runCtx.Err() != nil {
					break
				}
				if err != nil {
					errs.Add(1)
					reportErr(err)
					continue
				}
				requests.Add(1)
				sent.Add(int64(len(hashes)))
				newSent.Add(int64(nNew))
				refreshSent.Add(int64(len(hashes) - nNew))
				rejected.Add(int64(len(rej)))
				local = append(local, float64(d.Microseconds())/1000)
			}
			latMu.Lock()
			lats = append(lats, local...)
			latMu.Unlock()
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var prevSent, prevNew int64
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
				s, n := sent.Load(), newSent.Load()
				fmt.Fprintf(stderr, "t=%4.0fs  series/s=%10d  new/s=%10d  requests=%8d  rejected=%d  errors=%d\n",
					time.Since(start).Seconds(), s-prevSent, n-prevNew, requests.Load(), rejected.Load(), errs.Load())
				prevSent, prevNew = s, n
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	<-progressDone

	slices.Sort(lats)
	pct := func(q float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(q*float64(len(lats))))]
	}
	sum := BenchSummary{
		DurationSec: elapsed, Requests: requests.Load(), SeriesSent: sent.Load(),
		SeriesPerSec:        float64(sent.Load()) / elapsed,
		NewSeriesPerSec:     float64(newSent.Load()-min(rejected.Load(), newSent.Load())) / elapsed,
		RefreshSeriesPerSec: float64(refreshSent.Load()) / elapsed,
		P50Ms:               pct(0.50), P90Ms: pct(0.90), P99Ms: pct(0.99), MaxMs: pct(1),
		Rejected: rejected.Load(), Errors: errs.Load(),
		Tenants: o.tenants, RequestSize: o.requestSize, Concurrency: o.concurrency, NewFraction: o.newFraction,
	}
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	fmt.Fprintf(stdout, "%.1fs: %d requests, %.0f series/s (%.0f new/s, %.0f refresh/s), latency p50 %.2fms p90 %.2fms p99 %.2fms max %.2fms, %d rejected, %d errors\n",
		sum.DurationSec, sum.Requests, sum.SeriesPerSec, sum.NewSeriesPerSec, sum.RefreshSeriesPerSec, sum.P50Ms, sum.P90Ms, sum.P99Ms, sum.MaxMs, sum.Rejected, sum.Errors)
	return nil
}

// prefill creates seriesPerTenant series for every tenant, spread evenly over
// partitions, with the same concurrency as the measured run.
func (b *benchState) prefill(ctx context.Context, c *clientlib.Client) error {
	o := b.o
	type job struct{ t, p int }
	jobs := make(chan job)
	var (
		failed   atomic.Bool
		errOnce  sync.Once
		firstErr error
	)
	var wg sync.WaitGroup
	perPart := (o.seriesPerTenant + int64(o.partitions) - 1) / int64(o.partitions)
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hashes := make([]uint64, 0, o.requestSize)
			for j := range jobs {
				if failed.Load() {
					continue // drain the queue so the producer never blocks
				}
				for k0 := int64(0); k0 < perPart; k0 += int64(o.requestSize) {
					hashes = hashes[:0]
					for k := k0; k < min(perPart, k0+int64(o.requestSize)); k++ {
						hashes = append(hashes, b.hash(j.t, j.p, k))
					}
					rctx, cancel := context.WithTimeout(ctx, o.timeout)
					_, err := c.TrackPartition(rctx, b.tenants[j.t], j.p, hashes)
					cancel()
					if err != nil {
						errOnce.Do(func() { firstErr = err })
						failed.Store(true)
						break
					}
				}
				b.next[j.t][j.p].Store(perPart)
				b.created[j.t].Add(perPart)
			}
		}()
	}
	for t := range o.tenants {
		for p := range o.partitions {
			jobs <- job{t, p}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("prefill: %w", firstErr)
	}
	return nil
}
