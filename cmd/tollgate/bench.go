package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

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
	rate            float64 // series per second offered (open loop); 0: closed loop
	duration        time.Duration
	prefill         bool
	partitions      int // learned from the cluster
	seed            uint64
	timeout         time.Duration
	asJSON          bool
	failOpen        bool
	metricsURLs     []string // nodes' /metrics, for the cost report
	tls             clientTLSOpts
}

// BenchSummary is the final report (--json prints it). Counts are of series
// (hashes) in requests that completed during the measured run, and add up:
//
//	sent = new + refresh = accepted + rejected + failed
//
// new: series this run (or its --prefill) had not sent before; refresh: re-sends
// of series sent before (a re-send of a rejected series can be rejected again).
// failed: series of requests that failed (error or timeout): their outcome is
// unknown. Rates are per second of the measured run.
type BenchSummary struct {
	DurationSec    float64 `json:"duration_s"`
	Requests       int64   `json:"requests"`        // completed requests: succeeded + failed
	RequestsFailed int64   `json:"requests_failed"` // requests that returned an error
	Sent           int64   `json:"sent"`
	New            int64   `json:"new"`
	Refresh        int64   `json:"refresh"`
	Accepted       int64   `json:"accepted"`
	Rejected       int64   `json:"rejected"`
	Failed         int64   `json:"failed"`
	NewAccepted    int64   `json:"new_accepted"`   // new series the cluster accepted (created)
	NewRejected    int64   `json:"new_rejected"`   // new series rejected (tenant at its limit)
	SeriesPerSec   float64 `json:"series_per_sec"` // (accepted + rejected) / s: series answered
	NewPerSec      float64 `json:"new_accepted_per_sec"`
	RefreshPerSec  float64 `json:"refresh_per_sec"` // refreshes answered / s
	P50Ms          float64 `json:"p50_ms"`
	P90Ms          float64 `json:"p90_ms"`
	P99Ms          float64 `json:"p99_ms"`
	MaxMs          float64 `json:"max_ms"`
	Tenants        int     `json:"tenants"`
	RequestSize    int     `json:"request_size"`
	Concurrency    int     `json:"concurrency"`
	// Open loop (--rate): the offered rate, and the requests that were due
	// before the run ended but never sent because every slot was busy
	// (more than a handful means the offered rate was not sustained).
	OfferedPerSec float64  `json:"offered_series_per_sec,omitempty"`
	Unsent        int64    `json:"unsent,omitempty"`
	NewFraction   float64  `json:"new_fraction"`
	FirstErrors   []string `json:"first_errors,omitempty"`
	// What the client library did to get the answers, from its own counters
	// (clientlib.Stats): re-sent RPCs, NotLeader answers, and requests that
	// failed and were answered "no rejections" (--fail-open).
	Retries            uint64           `json:"retries"`
	NotLeaderRedirects uint64           `json:"not_leader_redirects"`
	FailedOpen         uint64           `json:"failed_open"`
	ErrorsByCode       map[string]int64 `json:"errors_by_code,omitempty"` // failed requests by gRPC code
	// Seconds is the run second by second (the progress lines on stderr).
	Seconds []BenchSecond `json:"seconds,omitempty"`
	// Cost is the servers' CPU per series (--metrics-url; absent without).
	Cost *BenchCost `json:"cost,omitempty"`
}

// BenchSecond is one second of a run as the caller saw it: what rolling
// restarts and leader moves cost is visible here and lost in the totals.
type BenchSecond struct {
	T            int              `json:"t"` // seconds since the start, end of the interval
	Requests     int64            `json:"requests"`
	Errors       int64            `json:"errors"` // requests that returned an error to the caller
	ErrorsByCode map[string]int64 `json:"errors_by_code,omitempty"`
	Retries      uint64           `json:"retries"`
	NotLeader    uint64           `json:"not_leader"`
	FailedOpen   uint64           `json:"failed_open"`
	P99Ms        float64          `json:"p99_ms"` // of the requests that succeeded in this second
	MaxMs        float64          `json:"max_ms"`
}

// benchWindow collects one second of outcomes; the progress ticker swaps it.
type benchWindow struct {
	mu       sync.Mutex
	requests int64
	errs     map[string]int64
	lats     []float64
}

func (w *benchWindow) add(d time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.requests++
	if err != nil {
		if w.errs == nil {
			w.errs = map[string]int64{}
		}
		w.errs[status.Code(err).String()]++
		return
	}
	w.lats = append(w.lats, float64(d.Microseconds())/1000)
}

// take returns the window's outcomes and starts a new window.
func (w *benchWindow) take() (int64, map[string]int64, []float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, e, l := w.requests, w.errs, w.lats
	w.requests, w.errs, w.lats = 0, nil, nil
	return n, e, l
}

// second turns one window plus the client's counter deltas into a BenchSecond.
func benchSecondOf(t int, n int64, errs map[string]int64, lats []float64, d clientlib.Stats) BenchSecond {
	slices.Sort(lats)
	bs := BenchSecond{T: t, Requests: n, ErrorsByCode: errs, Retries: d.Retries, NotLeader: d.NotLeaderRedirects, FailedOpen: d.FailedOpen}
	for _, v := range errs {
		bs.Errors += v
	}
	if len(lats) > 0 {
		bs.P99Ms = lats[min(len(lats)-1, int(0.99*float64(len(lats))))]
		bs.MaxMs = lats[len(lats)-1]
	}
	return bs
}

// statsDelta is the growth of the counters bench reports, from a to b.
func statsDelta(a, b clientlib.Stats) clientlib.Stats {
	return clientlib.Stats{Retries: b.Retries - a.Retries, NotLeaderRedirects: b.NotLeaderRedirects - a.NotLeaderRedirects, FailedOpen: b.FailedOpen - a.FailedOpen}
}

func (bs BenchSecond) line() string {
	errs := "0"
	if bs.Errors > 0 {
		keys := slices.Sorted(maps.Keys(bs.ErrorsByCode))
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s:%d", k, bs.ErrorsByCode[k]))
		}
		errs = fmt.Sprintf("%d (%s)", bs.Errors, strings.Join(parts, " "))
	}
	return fmt.Sprintf("requests=%6d  errors=%s  retries=%d  not-leader=%d  fail-open=%d  p99=%.2fms  max=%.2fms",
		bs.Requests, errs, bs.Retries, bs.NotLeader, bs.FailedOpen, bs.P99Ms, bs.MaxMs)
}

// benchCounts accumulates the summary's counts from concurrent workers.
type benchCounts struct {
	requests, requestsFailed                        atomic.Int64
	sent, newN, refresh                             atomic.Int64
	accepted, rejected, failed, newAcc, newRejected atomic.Int64
}

// record counts one completed request whose first nNew hashes are new series.
func (c *benchCounts) record(hashes []uint64, nNew int, rej []uint64, err error) {
	c.requests.Add(1)
	c.sent.Add(int64(len(hashes)))
	c.newN.Add(int64(nNew))
	c.refresh.Add(int64(len(hashes) - nNew))
	if err != nil {
		c.requestsFailed.Add(1)
		c.failed.Add(int64(len(hashes)))
		return
	}
	// Rejected hashes are listed once per occurrence in the request.
	newRej := 0
	if len(rej) > 0 && nNew > 0 {
		isNew := make(map[uint64]bool, nNew)
		for _, h := range hashes[:nNew] {
			isNew[h] = true
		}
		for _, h := range rej {
			if isNew[h] {
				newRej++
			}
		}
	}
	c.accepted.Add(int64(len(hashes) - len(rej)))
	c.rejected.Add(int64(len(rej)))
	c.newAcc.Add(int64(nNew - newRej))
	c.newRejected.Add(int64(newRej))
}

// summary turns the counts into the report.
func (c *benchCounts) summary(elapsed float64, lats []float64) BenchSummary {
	pct := func(q float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(q*float64(len(lats))))]
	}
	s := BenchSummary{
		DurationSec: elapsed, Requests: c.requests.Load(), RequestsFailed: c.requestsFailed.Load(),
		Sent: c.sent.Load(), New: c.newN.Load(), Refresh: c.refresh.Load(),
		Accepted: c.accepted.Load(), Rejected: c.rejected.Load(), Failed: c.failed.Load(),
		NewAccepted: c.newAcc.Load(), NewRejected: c.newRejected.Load(),
		P50Ms: pct(0.50), P90Ms: pct(0.90), P99Ms: pct(0.99), MaxMs: pct(1),
	}
	if elapsed > 0 {
		s.SeriesPerSec = float64(s.Accepted+s.Rejected) / elapsed
		s.NewPerSec = float64(s.NewAccepted) / elapsed
		// Answered refreshes: the refreshes of successful requests.
		s.RefreshPerSec = float64(s.Accepted+s.Rejected-s.NewAccepted-s.NewRejected) / elapsed
	}
	return s
}

// failure makes a run exit non-zero when it measured mostly errors: no request
// succeeded, or more than half failed.
func (s BenchSummary) failure() error {
	ok := s.Requests - s.RequestsFailed
	if ok > 0 && s.RequestsFailed*2 <= s.Requests {
		return nil
	}
	why := fmt.Sprintf("%d of %d requests failed", s.RequestsFailed, s.Requests)
	if ok == 0 {
		why = fmt.Sprintf("no request succeeded (%d failed)", s.RequestsFailed)
	}
	if len(s.FirstErrors) > 0 {
		why += "; first errors:\n  " + strings.Join(s.FirstErrors, "\n  ")
	}
	return fmt.Errorf("bench: %s", why)
}

func newBenchCmd() *cobra.Command {
	var o benchOpts
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load generator: track new and refreshed series against a cluster and report throughput and latency",
		Long: `Load generator. Each request carries --request-size hashes of one tenant and one
partition; a --new-fraction of them are series never sent before and the rest
re-send series already sent (refreshes). Once a tenant has --series-per-tenant
series, it only refreshes. Series are generated deterministically from (seed,
tenant, partition, index), so --prefill (create --series-per-tenant series per
tenant before measuring) followed by --new-fraction 0 measures pure refreshes.
The layout (partitions) is learned from the cluster.

The defaults (10 tenants × 100,000 series) stay below the dev server's default
limit of 150,000 series per tenant: a run creates series, then refreshes them,
with no rejections. Above a tenant's limit new series are rejected, which the
summary counts apart (new_rejected).

Summary counts are series in requests that completed during the run:
sent = new + refresh = accepted + rejected + failed (failed: in requests that
returned an error). The command exits non-zero, printing the first errors,
when no request succeeded or more than half failed.

Each second a line on stderr shows what the caller saw in that second:
requests completed, errors returned by gRPC code, the client library's
retries, NotLeader answers and fail-open decisions (--fail-open: a request
that failed for an availability reason returns "no rejections", as a
distributor configured that way would admit the write), and the p99 and max
latency of the requests that succeeded. --json adds them to the summary
("seconds"); the summary goes to stdout. An interrupt (SIGINT) ends the run
early and prints the summary.

--metrics-url lists the nodes' HTTP addresses: bench reads each node's
process_cpu_seconds_total just before and just after the measured run and
reports the servers' CPU seconds and ns of server CPU per series (every series
of every request that returned in between), summed and per node ("cost" in
--json). Client and server share a machine's cores, so series/s and latency
partly measure the machine; CPU per series is what the server code controls.`,
		Example: `  tollgate bench --duration 10s
  tollgate bench --new-fraction 1 --series-per-tenant 100000000 --duration 10s --json   # needs --default-max-series 0
  tollgate bench --prefill --series-per-tenant 100000 --new-fraction 0 --duration 10s
  tollgate bench --metrics-url 127.0.0.1:7380 --duration 10s   # + the node's CPU per series`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addrs, "addr", defaultAddr(), "comma-separated gRPC addresses (env TOLLGATE_ADDR)")
	f.IntVar(&o.tenants, "tenants", 10, "number of tenants (bench-0 … bench-N)")
	f.Int64Var(&o.seriesPerTenant, "series-per-tenant", 100_000, "series universe per tenant: once a tenant created this many, it only refreshes")
	f.Float64Var(&o.newFraction, "new-fraction", 1, "fraction of each request that is new series (0 = refresh only)")
	f.IntVar(&o.requestSize, "request-size", 1000, "hashes per request")
	f.IntVar(&o.concurrency, "concurrency", 16, "concurrent requests in flight (with --rate: the most in flight)")
	f.Float64Var(&o.rate, "rate", 0, "open loop: offer this many series per second whatever the answers' latency (0: closed loop, each of --concurrency slots sends its next request when answered)")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "measured duration")
	f.BoolVar(&o.prefill, "prefill", false, "create every tenant's series before measuring")
	f.Uint64Var(&o.seed, "seed", 1, "series generator seed")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "per-request deadline (and for learning the layout)")
	f.BoolVar(&o.asJSON, "json", false, "print the summary as JSON")
	f.StringSliceVar(&o.metricsURLs, "metrics-url", nil, "nodes' HTTP addresses (host:port of --http-addr, or URLs of /metrics), comma-separated or repeated: report the servers' CPU per series from their process_cpu_seconds_total, summed and per node (list every node of the cluster)")
	f.BoolVar(&o.failOpen, "fail-open", false, "configure the client with FailOpen (availability failures answer \"no rejections\"; counted as fail-open)")
	o.tls.register(f)
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
	if o.tenants < 1 || o.requestSize < 1 || o.concurrency < 1 || o.newFraction < 0 || o.newFraction > 1 || o.seriesPerTenant < 1 || o.duration <= 0 || o.timeout <= 0 || o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0) {
		return fmt.Errorf("bench: --tenants, --request-size, --concurrency, --series-per-tenant must be ≥ 1, --duration and --timeout > 0, --rate ≥ 0 and finite, and --new-fraction in [0,1]")
	}
	var probe *costProbe
	if len(o.metricsURLs) > 0 {
		tlsCfg, err := o.tls.config()
		if err != nil {
			return err
		}
		if probe, err = newCostProbe(o.metricsURLs, tlsCfg, o.timeout); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	// ModeSync: the load generator measures the servers' answers (and needs no
	// near-limit polling); TrackPartition waits for them in any mode.
	c, err := connectClientWith(ctx, o.addrs, o.timeout, &o.tls, func(cfg *clientlib.Config) { cfg.FailOpen = o.failOpen })
	if err != nil {
		return err
	}
	defer c.Close()
	o.partitions, _ = c.Layout()
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
		counts benchCounts
		latMu  sync.Mutex
		lats   []float64
		window benchWindow
		// served counts the series of every request that returned, even
		// after the run ended: the servers' CPU between the scrapes paid
		// for them all.
		served atomic.Int64
		cpu0   cpuSnapshot
	)
	if probe != nil {
		if cpu0, err = probe.read(ctx); err != nil {
			return fmt.Errorf("bench: cost report: %w", err)
		}
	}
	stats0 := c.Stats()
	// An interrupt (Ctrl-C, or a script's kill -INT) ends the measured run
	// early with a summary, like the end of --duration.
	sigCtx, stopSig := signal.NotifyContext(ctx, os.Interrupt)
	defer stopSig()
	runCtx, cancel := context.WithTimeout(sigCtx, o.duration)
	defer cancel()
	start := time.Now()
	// The first few distinct error messages go to stderr, so an error count
	// in the summary always comes with its cause.
	var errMu sync.Mutex
	var firstErrs []string
	reportErr := func(err error) {
		msg := err.Error()
		errMu.Lock()
		defer errMu.Unlock()
		if len(firstErrs) < 5 && !slices.Contains(firstErrs, msg) {
			firstErrs = append(firstErrs, msg)
			fmt.Fprintf(stderr, "error: %s\n", msg)
		}
	}
	// Open loop: a pacer puts each request's due time on a queue at the
	// offered rate, whether or not earlier requests have been answered, and
	// a request's latency counts from its due time, so time spent waiting
	// for a free slot is not hidden (no coordinated omission).
	var due chan time.Time
	if o.rate > 0 {
		due = make(chan time.Time, benchDueQueue)
		go pace(runCtx, start, time.Duration(float64(time.Second)*float64(o.requestSize)/o.rate), due)
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
				var t0 time.Time
				if due != nil {
					select {
					case t0 = <-due:
					case <-runCtx.Done():
					}
					if runCtx.Err() != nil {
						break
					}
				}
				t := (w + i*o.concurrency) % o.tenants
				p := r.IntN(o.partitions)
				hashes, nNew, p := b.request(t, p, r, hashes[:0])
				if len(hashes) == 0 {
					continue // nothing in any partition yet: the next request will have
				}
				// The request's deadline comes from ctx, not runCtx: requests in
				// flight when the run ends finish normally and are not counted,
				// instead of failing with DeadlineExceeded (the server's copy of
				// the deadline fires first, so such errors could not be told apart
				// from real ones).
				rctx, rcancel := context.WithTimeout(ctx, o.timeout)
				if due == nil {
					t0 = time.Now()
				}
				rej, err := c.TrackPartition(rctx, b.tenants[t], p, hashes)
				d := time.Since(t0)
				rcancel()
				served.Add(int64(len(hashes)))
				if runCtx.Err() != nil {
					break
				}
				counts.record(hashes, nNew, rej, err)
				window.add(d, err)
				if err != nil {
					reportErr(err)
					continue
				}
				local = append(local, float64(d.Microseconds())/1000)
			}
			latMu.Lock()
			lats = append(lats, local...)
			latMu.Unlock()
		}()
	}
	progressDone := make(chan struct{})
	var seconds []BenchSecond
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var prevSent, prevNew int64
		prevStats := stats0
		for sec := 1; ; sec++ {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
				s, n := counts.sent.Load(), counts.newAcc.Load()
				st := c.Stats()
				nreq, errs, wl := window.take()
				bs := benchSecondOf(sec, nreq, errs, wl, statsDelta(prevStats, st))
				seconds = append(seconds, bs)
				fmt.Fprintf(stderr, "t=%4ds  sent/s=%9d  new accepted/s=%9d  %s\n", sec, s-prevSent, n-prevNew, bs.line())
				prevSent, prevNew, prevStats = s, n, st
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	<-progressDone
	var costErr error
	var cost *BenchCost
	if probe != nil {
		// ctx, not runCtx: the run has ended, the scrape must still happen.
		if cpu1, err := probe.read(ctx); err != nil {
			costErr = fmt.Errorf("bench: cost report: %w", err)
		} else {
			cost = benchCost(probe.urls, cpu0, cpu1, served.Load())
		}
	}

	slices.Sort(lats)
	sum := counts.summary(elapsed, lats)
	sum.Tenants, sum.RequestSize, sum.Concurrency, sum.NewFraction = o.tenants, o.requestSize, o.concurrency, o.newFraction
	if due != nil {
		sum.OfferedPerSec, sum.Unsent = o.rate, int64(len(due))
	}
	sum.FirstErrors = firstErrs
	d := statsDelta(stats0, c.Stats())
	sum.Retries, sum.NotLeaderRedirects, sum.FailedOpen = d.Retries, d.NotLeaderRedirects, d.FailedOpen
	sum.Seconds = seconds
	sum.Cost = cost
	for _, bs := range seconds {
		for k, v := range bs.ErrorsByCode {
			if sum.ErrorsByCode == nil {
				sum.ErrorsByCode = map[string]int64{}
			}
			sum.ErrorsByCode[k] += v
		}
	}
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		printBenchSummary(stdout, sum)
	}
	if err := sum.failure(); err != nil {
		return err
	}
	return costErr
}

func printBenchSummary(out io.Writer, s BenchSummary) {
	fmt.Fprintf(out, "%.1fs: %d requests (%d failed)\n", s.DurationSec, s.Requests, s.RequestsFailed)
	fmt.Fprintf(out, "  series sent %d = new %d + refresh %d = accepted %d + rejected %d + failed %d\n",
		s.Sent, s.New, s.Refresh, s.Accepted, s.Rejected, s.Failed)
	fmt.Fprintf(out, "  new series: %d accepted, %d rejected (tenant at its limit)\n", s.NewAccepted, s.NewRejected)
	fmt.Fprintf(out, "  %.0f series/s answered (%.0f new accepted/s, %.0f refresh/s); latency p50 %.2fms p90 %.2fms p99 %.2fms max %.2fms\n",
		s.SeriesPerSec, s.NewPerSec, s.RefreshPerSec, s.P50Ms, s.P90Ms, s.P99Ms, s.MaxMs)
	if s.OfferedPerSec > 0 {
		fmt.Fprintf(out, "  open loop: %.0f series/s offered; latency counted from each request's due time; %d due requests never sent (all %d slots busy)\n",
			s.OfferedPerSec, s.Unsent, s.Concurrency)
	}
	fmt.Fprintf(out, "  client: %d retries, %d NotLeader answers, %d fail-open decisions", s.Retries, s.NotLeaderRedirects, s.FailedOpen)
	if len(s.ErrorsByCode) > 0 {
		keys := slices.Sorted(maps.Keys(s.ErrorsByCode))
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, s.ErrorsByCode[k]))
		}
		fmt.Fprintf(out, "; errors by code (per-second windows): %s", strings.Join(parts, ", "))
	}
	fmt.Fprintln(out)
	if s.Cost != nil {
		printBenchCost(out, s.Cost)
	}
	if n := len(s.Seconds); n > 0 {
		worst := s.Seconds[0]
		for _, bs := range s.Seconds {
			if bs.P99Ms > worst.P99Ms {
				worst = bs
			}
		}
		p99s := make([]float64, 0, n)
		for _, bs := range s.Seconds {
			p99s = append(p99s, bs.P99Ms)
		}
		slices.Sort(p99s)
		fmt.Fprintf(out, "  per-second p99: median %.2fms, worst %.2fms (t=%ds)\n", p99s[n/2], worst.P99Ms, worst.T)
	}
}

// benchDueQueue bounds the open-loop backlog of due requests; when it is
// full the pacer waits, and the summary's unsent count shows the shortfall.
const benchDueQueue = 1 << 16

// pace puts due times on out, one per interval from start, until ctx ends.
// Due times follow the schedule, not the moment they were queued, so a late
// wake-up neither drifts the rate nor hides the lateness.
func pace(ctx context.Context, start time.Time, interval time.Duration, out chan<- time.Time) {
	if interval <= 0 {
		interval = time.Nanosecond
	}
	for next := start; ; next = next.Add(interval) {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		select {
		case out <- next:
		case <-ctx.Done():
			return
		}
	}
}

// request fills hashes with one request for tenant t in partition p (or,
// once the tenant's universe is used up and p holds none of it, in a
// partition that does; the partition used is returned): first the new series
// (nNew of them), then refreshes of series sent before. Empty when there is
// nothing to send yet (another worker reserved the last new series and has
// not sent them).
func (b *benchState) request(t, p int, r *rand.Rand, hashes []uint64) ([]uint64, int, int) {
	o := b.o
	want := int64(math.Round(o.newFraction * float64(o.requestSize)))
	if b.next[t][p].Load() == 0 {
		want = int64(o.requestSize) // nothing to refresh in this partition yet
	}
	nNew := b.reserve(t, want)
	if nNew == 0 && b.next[t][p].Load() == 0 {
		for i := 1; i < o.partitions; i++ {
			if q := (p + i) % o.partitions; b.next[t][q].Load() > 0 {
				p = q
				break
			}
		}
	}
	if nNew > 0 {
		k0 := b.next[t][p].Add(nNew) - nNew
		for k := k0; k < k0+nNew; k++ {
			hashes = append(hashes, b.hash(t, p, k))
		}
	}
	// Refreshes draw from the series created before this request's own.
	have := b.next[t][p].Load() - nNew
	if have <= 0 {
		return hashes, int(nNew), p
	}
	for len(hashes) < o.requestSize {
		hashes = append(hashes, b.hash(t, p, r.Int64N(have)))
	}
	return hashes, int(nNew), p
}

// reserve takes up to want new series from tenant t's universe
// (--series-per-tenant) and returns how many it got: concurrent workers never
// create more than the universe between them (a check-then-add let each
// worker past the check add a whole request, 8–17 % over).
func (b *benchState) reserve(t int, want int64) int64 {
	for want > 0 {
		cur := b.created[t].Load()
		n := min(want, b.o.seriesPerTenant-cur)
		if n <= 0 {
			return 0
		}
		if b.created[t].CompareAndSwap(cur, cur+n) {
			return n
		}
	}
	return 0
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
	// Exactly --series-per-tenant per tenant: the first series%partitions
	// partitions take one more than the others.
	perPartOf := func(p int) int64 {
		n := o.seriesPerTenant / int64(o.partitions)
		if int64(p) < o.seriesPerTenant%int64(o.partitions) {
			n++
		}
		return n
	}
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hashes := make([]uint64, 0, o.requestSize)
			for j := range jobs {
				if failed.Load() {
					continue // drain the queue so the producer never blocks
				}
				perPart := perPartOf(j.p)
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
