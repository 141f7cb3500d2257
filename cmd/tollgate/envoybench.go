package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// envoyBenchOpts are the flags of `tollgate envoybench`.
type envoyBenchOpts struct {
	addrs       string
	domain      string
	descriptor  string
	conns       int
	concurrency int
	rate        float64
	duration    time.Duration
	warmup      time.Duration
	timeout     time.Duration
	pids        []int
	metricsURLs []string
	boundary    time.Duration
	burst       int
	offset      time.Duration
	limit       int
	token       string
	asJSON      bool
}

// EnvoyBenchResult is what one envoybench run measured (--json prints it).
type EnvoyBenchResult struct {
	Mode        string  `json:"mode"` // closed, open or boundary
	Target      string  `json:"target"`
	OfferedPerS float64 `json:"offered_per_s,omitempty"` // open loop only
	Calls       int64   `json:"calls"`                   // answered or failed in the measured span
	OK          int64   `json:"ok"`
	OverLimit   int64   `json:"over_limit"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Seconds     float64 `json:"seconds"`
	PerS        float64 `json:"decisions_per_s"`
	// Sustained: an open loop answered at least 97 % of the offered rate.
	Sustained bool    `json:"sustained"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	MaxUs     float64 `json:"max_us"`
	// Server side, when --pid or --metrics-url name the processes.
	ServerCPU      float64          `json:"server_cpu_s,omitempty"`
	PerCPUSecond   float64          `json:"decisions_per_cpu_s,omitempty"`
	NsPerDecision  float64          `json:"ns_per_decision,omitempty"`
	ServerCPUParts []EnvoyBenchPart `json:"server_cpu_parts,omitempty"`
	Boundary       *BoundaryResult  `json:"boundary,omitempty"`
}

// EnvoyBenchPart is one server-side process's CPU over the measured span.
type EnvoyBenchPart struct {
	Name       string  `json:"name"` // pid:N or a metrics URL
	CPUSeconds float64 `json:"cpu_s"`
}

// BoundaryResult is a burst just before a window boundary and one just
// after it: a fixed-window counter starts afresh at the boundary and admits
// up to the limit again, so (before + after) ÷ limit can reach 2 within far
// less than one unit; a sliding window or a token bucket keeps it near 1.
type BoundaryResult struct {
	UnitSeconds float64 `json:"unit_s"`
	Limit       int     `json:"limit"`
	Burst       int     `json:"burst"`
	BeforeOK    int64   `json:"before_ok"`
	AfterOK     int64   `json:"after_ok"`
	Admitted    float64 `json:"admitted_over_limit"` // (before + after) ÷ limit
	SpanMs      float64 `json:"span_ms"`             // first call sent to last answer
}

func newEnvoyBenchCmd() *cobra.Command {
	var o envoyBenchOpts
	cmd := &cobra.Command{
		Use:   "envoybench",
		Short: "Drive Envoy's ShouldRateLimit at any rate limit service (Tollgate or envoyproxy/ratelimit) and report its cost",
		Long: `envoybench calls envoy.service.ratelimit.v3 ShouldRateLimit with the
go-control-plane client, one descriptor per call (--domain, --descriptor), so
the same load can be pointed at a Tollgate node or at the reference service
(envoyproxy/ratelimit) and the two compared. It is a closed loop of
--concurrency calls in flight, or with --rate an open loop: calls leave on a
fixed schedule and a call's latency runs from its scheduled time, so a stall
counts against every call it delayed.

--pid names server-side processes (the rate limit service, and Redis for the
reference): their user + system CPU is read from /proc/<pid>/stat just before
and just after the measured span. --metrics-url does the same from Tollgate
nodes' process_cpu_seconds_total. The report gives decisions per CPU-second of
all of them together: client and server share the machine's cores, so rates
and tails partly measure the machine; CPU per decision is what the server
controls.

--boundary UNIT (1s or 1m) instead sends --burst calls at once --offset before
the next multiple of UNIT (UTC) and --burst more --offset after it, and
reports the calls answered OK in both ÷ --limit. Give a rule of --limit per
UNIT and a descriptor value no earlier run used: a fixed-window counter starts
afresh at the boundary and can admit up to 2× the limit within a fraction of
a unit.`,
		Example: `  tollgate envoybench --addr 127.0.0.1:7300 --domain bench --descriptor api=ingest --concurrency 32 --duration 10s --pid 1234
  tollgate envoybench --addr 127.0.0.1:8081 --descriptor api=ingest --rate 5000 --pid 2345,2346 --json
  tollgate envoybench --addr 127.0.0.1:7300 --descriptor boundary_s=run7 --boundary 1s --limit 50 --burst 100`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEnvoyBench(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addrs, "addr", defaultAddr(), "gRPC address(es) of the service, comma-separated: connections are spread over them")
	f.StringVar(&o.domain, "domain", "bench", "the requests' domain")
	f.StringVar(&o.descriptor, "descriptor", "api=ingest", "the one descriptor of every call: key=value entries, comma-separated")
	f.IntVar(&o.conns, "conns", 4, "gRPC connections")
	f.IntVar(&o.concurrency, "concurrency", 32, "calls in flight (closed loop); callers (open loop and --boundary)")
	f.Float64Var(&o.rate, "rate", 0, "open loop: calls per second on a fixed schedule (0: closed loop)")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "measured span")
	f.DurationVar(&o.warmup, "warmup", time.Second, "closed-loop calls before the measured span (connections, leases, caches)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "per-call deadline")
	f.IntSliceVar(&o.pids, "pid", nil, "server-side process ids whose CPU (from /proc/<pid>/stat) is the run's cost, comma-separated or repeated")
	f.StringSliceVar(&o.metricsURLs, "metrics-url", nil, "Tollgate nodes' HTTP addresses: their process_cpu_seconds_total is the run's cost (with --pid: added)")
	f.DurationVar(&o.boundary, "boundary", 0, "window-boundary test: the rule's unit (1s or 1m); 0: off")
	f.IntVar(&o.burst, "burst", 0, "with --boundary: calls in each of the two bursts (default 2 × --limit)")
	f.DurationVar(&o.offset, "offset", 100*time.Millisecond, "with --boundary: how long before and after the boundary each burst leaves")
	f.IntVar(&o.limit, "limit", 0, "with --boundary: the rule's requests_per_unit")
	f.StringVar(&o.token, "token", os.Getenv("TOLLGATE_ENVOY_TOKEN"), "bearer token sent as authorization metadata, as Envoy's initial_metadata would (env TOLLGATE_ENVOY_TOKEN; a --dev node ignores it)")
	f.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	return cmd
}

// parseDescriptor turns "k=v,k2=v2" into the descriptor's entries.
func parseDescriptor(s string) (*commonrl.RateLimitDescriptor, error) {
	d := &commonrl.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--descriptor: entry %q: want key=value", kv)
		}
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

func (o envoyBenchOpts) validate() error {
	switch {
	case o.conns < 1:
		return errors.New("--conns: want at least 1")
	case o.concurrency < 1:
		return errors.New("--concurrency: want at least 1")
	case o.rate < 0:
		return errors.New("--rate: want ≥ 0")
	case o.boundary == 0 && o.duration <= 0:
		return errors.New("--duration: want > 0")
	case o.warmup < 0:
		return errors.New("--warmup: want ≥ 0")
	case o.boundary < 0:
		return errors.New("--boundary: want a unit such as 1s or 1m")
	case o.boundary > 0 && o.limit < 1:
		return errors.New("--limit: the rule's requests_per_unit, needed with --boundary")
	case o.boundary > 0 && (o.offset <= 0 || 2*o.offset >= o.boundary):
		return fmt.Errorf("--offset %v: want > 0 and under half of --boundary %v", o.offset, o.boundary)
	case o.burst < 0:
		return errors.New("--burst: want ≥ 0")
	}
	for _, p := range o.pids {
		if p <= 0 {
			return fmt.Errorf("--pid %d: want a process id", p)
		}
	}
	return nil
}

// cpuMeter reads the server side's CPU seconds, per process.
type cpuMeter struct {
	pids  []int
	probe *costProbe
}

// procTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux architecture Go supports (the kernel fixes what it exports to user
// space, whatever its internal HZ).
const procTicks = 100

// procCPU is a process's user + system CPU seconds, all its threads, from
// /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("--pid %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces and parentheses: count
	// fields from the last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("--pid %d: unreadable /proc stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("--pid %d: short /proc stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("--pid %d: %w", pid, err)
	}
	return float64(ut+st) / procTicks, nil
}

func (m *cpuMeter) names() []string {
	var n []string
	for _, p := range m.pids {
		n = append(n, fmt.Sprintf("pid:%d", p))
	}
	if m.probe != nil {
		n = append(n, m.probe.urls...)
	}
	return n
}

func (m *cpuMeter) read(ctx context.Context) ([]float64, error) {
	var out []float64
	for _, p := range m.pids {
		v, err := procCPU(p)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if m.probe != nil {
		s, err := m.probe.read(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, s.cpu...)
	}
	return out, nil
}

// envoyCaller is the state every call shares.
type envoyCaller struct {
	clients        []rlsv3.RateLimitServiceClient
	timeout        time.Duration
	ok, over, errs atomic.Int64
	firstErr       atomic.Pointer[string]
}

// call makes one call and counts its answer; it reports whether it was OK.
func (c *envoyCaller) call(ctx context.Context, i int, req *rlsv3.RateLimitRequest) bool {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.clients[i%len(c.clients)].ShouldRateLimit(ctx, req)
	switch {
	case err != nil:
		c.errs.Add(1)
		s := err.Error()
		c.firstErr.CompareAndSwap(nil, &s)
		return false
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		c.ok.Add(1)
		return true
	default:
		c.over.Add(1)
		return false
	}
}

func (c *envoyCaller) reset() {
	c.ok.Store(0)
	c.over.Store(0)
	c.errs.Store(0)
	c.firstErr.Store(nil)
}

func runEnvoyBench(ctx context.Context, o envoyBenchOpts, out io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	desc, err := parseDescriptor(o.descriptor)
	if err != nil {
		return err
	}
	req := &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*commonrl.RateLimitDescriptor{desc}}
	meter := &cpuMeter{pids: o.pids}
	if len(o.metricsURLs) > 0 {
		if meter.probe, err = newCostProbe(o.metricsURLs, nil, o.timeout); err != nil {
			return err
		}
	}
	var addrs []string
	for _, a := range strings.Split(o.addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return errors.New("--addr: no address")
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearerCreds(o.token)))
	}
	c := &envoyCaller{timeout: o.timeout}
	for i := range o.conns {
		cc, err := grpc.NewClient(addrs[i%len(addrs)], dial...)
		if err != nil {
			return fmt.Errorf("--addr %s: %w", addrs[i%len(addrs)], err)
		}
		defer cc.Close()
		c.clients = append(c.clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	res := EnvoyBenchResult{Mode: "closed", Target: strings.Join(addrs, ",")}
	if o.boundary > 0 {
		res.Mode = "boundary"
		if err := runBoundary(ctx, o, c, req, &res); err != nil {
			return err
		}
	} else {
		if o.warmup > 0 {
			closedLoop(ctx, c, req, o.concurrency, o.warmup)
			if c.errs.Load() > 0 {
				return fmt.Errorf("warm-up: %d calls failed, the first: %s", c.errs.Load(), *c.firstErr.Load())
			}
			c.reset()
		}
		cpu0, err := meter.read(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		var lat []time.Duration
		if o.rate > 0 {
			res.Mode, res.OfferedPerS = "open", o.rate
			lat = openLoop(ctx, c, req, o.concurrency, o.rate, o.duration)
		} else {
			lat = closedLoop(ctx, c, req, o.concurrency, o.duration)
		}
		el := time.Since(start)
		cpu1, err := meter.read(ctx)
		if err != nil {
			return err
		}
		res.Seconds = el.Seconds()
		fillLatency(&res, lat)
		res.OK, res.OverLimit = c.ok.Load(), c.over.Load()
		res.PerS = float64(res.OK+res.OverLimit) / res.Seconds
		res.Sustained = o.rate == 0 || res.PerS >= 0.97*o.rate
		for i, n := range meter.names() {
			d := cpu1[i] - cpu0[i]
			res.ServerCPU += d
			res.ServerCPUParts = append(res.ServerCPUParts, EnvoyBenchPart{Name: n, CPUSeconds: d})
		}
		if decided := float64(res.OK + res.OverLimit); res.ServerCPU > 0 && decided > 0 {
			res.PerCPUSecond = decided / res.ServerCPU
			res.NsPerDecision = res.ServerCPU * 1e9 / decided
		}
	}
	res.OK, res.OverLimit, res.Errors = c.ok.Load(), c.over.Load(), c.errs.Load()
	if p := c.firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	if o.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printEnvoyBench(out, &res)
	return nil
}

// fillLatency sets the call counts and latency quantiles.
func fillLatency(res *EnvoyBenchResult, lat []time.Duration) {
	slices.Sort(lat)
	res.Calls = int64(len(lat))
	if len(lat) == 0 {
		return
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	res.P50us = us(lat[len(lat)/2])
	res.P99us = us(lat[len(lat)*99/100])
	res.MaxUs = us(lat[len(lat)-1])
}

// closedLoop keeps n calls in flight for d and returns every call's latency.
func closedLoop(ctx context.Context, c *envoyCaller, req *rlsv3.RateLimitRequest, n int, d time.Duration) []time.Duration {
	stop := time.Now().Add(d)
	lat := make([][]time.Duration, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(stop) {
				t0 := time.Now()
				c.call(ctx, w, req)
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	return slices.Concat(lat...)
}

// openLoop sends rate calls a second for d from n callers. One dispatcher
// releases every call whose time has come (it sleeps between releases, so
// a late wake-up releases a small burst); a call's latency runs from its
// scheduled time, so time spent waiting for a free caller counts (no
// coordinated omission). Calls still queued when d ends are still made.
func openLoop(ctx context.Context, c *envoyCaller, req *rlsv3.RateLimitRequest, n int, rate float64, d time.Duration) []time.Duration {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	due := make(chan time.Time, min(total, 1<<16))
	lat := make([][]time.Duration, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for at := range due {
				c.call(ctx, w, req)
				lat[w] = append(lat[w], time.Since(at))
			}
		})
	}
	start := time.Now()
	for i := 0; i < total && ctx.Err() == nil; {
		now := time.Now()
		for ; i < total; i++ {
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
	return slices.Concat(lat...)
}

// runBoundary sends the two bursts around the next boundary of o.boundary.
func runBoundary(ctx context.Context, o envoyBenchOpts, c *envoyCaller, req *rlsv3.RateLimitRequest, res *EnvoyBenchResult) error {
	burst := o.burst
	if burst == 0 {
		burst = 2 * o.limit
	}
	// Open every connection with a call no rule matches (OK, no counter), so
	// the bursts time the decisions, not the dials.
	warm := &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*commonrl.RateLimitDescriptor{{
		Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "envoybench_warmup", Value: "x"}}}}}
	for i := range c.clients {
		c.call(ctx, i, warm)
	}
	if c.errs.Load() > 0 {
		return fmt.Errorf("warm-up: %s", *c.firstErr.Load())
	}
	c.reset()
	now := time.Now()
	edge := now.Truncate(o.boundary).Add(o.boundary)
	if edge.Sub(now) < o.offset+50*time.Millisecond {
		edge = edge.Add(o.boundary)
	}
	fire := func(at time.Time) (int64, time.Time, time.Time) {
		if w := time.Until(at); w > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w):
			}
		}
		sent := time.Now()
		var ok atomic.Int64
		next := make(chan struct{}, burst)
		for range burst {
			next <- struct{}{}
		}
		close(next)
		var wg sync.WaitGroup
		for w := range o.concurrency {
			wg.Go(func() {
				for range next {
					if c.call(ctx, w, req) {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return ok.Load(), sent, time.Now()
	}
	before, first, doneBefore := fire(edge.Add(-o.offset))
	if doneBefore.After(edge) {
		return fmt.Errorf("--boundary: the first burst ended %v after the boundary: lower --burst or raise --offset", doneBefore.Sub(edge))
	}
	after, _, last := fire(edge.Add(o.offset))
	res.Seconds = last.Sub(first).Seconds()
	res.Boundary = &BoundaryResult{UnitSeconds: o.boundary.Seconds(), Limit: o.limit, Burst: burst,
		BeforeOK: before, AfterOK: after, Admitted: float64(before+after) / float64(o.limit),
		SpanMs: float64(last.Sub(first).Microseconds()) / 1e3}
	res.Calls = int64(2 * burst)
	return nil
}

func printEnvoyBench(out io.Writer, r *EnvoyBenchResult) {
	if b := r.Boundary; b != nil {
		fmt.Fprintf(out, "boundary %gs, limit %d: %d OK of %d before, %d OK of %d after, within %.0f ms: admitted ÷ limit %.3f (errors %d)\n",
			b.UnitSeconds, b.Limit, b.BeforeOK, b.Burst, b.AfterOK, b.Burst, b.SpanMs, b.Admitted, r.Errors)
		return
	}
	offered := ""
	if r.Mode == "open" {
		offered = fmt.Sprintf(" at %.0f/s offered (sustained: %v)", r.OfferedPerS, r.Sustained)
	}
	fmt.Fprintf(out, "%s loop%s: %d calls in %.1fs, %.0f decisions/s (%d OK, %d over limit, %d errors); p50 %.0f µs, p99 %.0f µs, max %.0f µs\n",
		r.Mode, offered, r.Calls, r.Seconds, r.PerS, r.OK, r.OverLimit, r.Errors, r.P50us, r.P99us, r.MaxUs)
	if r.FirstError != "" {
		fmt.Fprintf(out, "  first error: %s\n", r.FirstError)
	}
	if len(r.ServerCPUParts) > 0 {
		var parts []string
		for _, p := range r.ServerCPUParts {
			parts = append(parts, fmt.Sprintf("%s %.2f s", p.Name, p.CPUSeconds))
		}
		fmt.Fprintf(out, "  server CPU %.2f s (%s): %.0f decisions per CPU-second, %.0f ns per decision\n",
			r.ServerCPU, strings.Join(parts, "; "), r.PerCPUSecond, r.NsPerDecision)
	}
}
