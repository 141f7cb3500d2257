package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
)

type boundaryResult struct {
	UnitSeconds float64 `json:"unit_s"`
	Limit       int     `json:"limit"`
	Burst       int     `json:"burst"`
	BeforeOK    int64   `json:"before_ok"`
	AfterOK     int64   `json:"after_ok"`
	Admitted    float64 `json:"admitted_over_limit"`
	SpanMs      float64 `json:"span_ms"`
}

type result struct {
	Mode          string          `json:"mode"`
	Target        string          `json:"target"`
	OfferedPerS   float64         `json:"offered_per_s,omitempty"`
	Calls         int64           `json:"calls"`
	OK            int64           `json:"ok"`
	OverLimit     int64           `json:"over_limit"`
	Errors        int64           `json:"errors"`
	FirstError    string          `json:"first_error,omitempty"`
	Seconds       float64         `json:"seconds"`
	PerS          float64         `json:"decisions_per_s"`
	Sustained     bool            `json:"sustained"`
	P50us         float64         `json:"p50_us"`
	P99us         float64         `json:"p99_us"`
	MaxUs         float64         `json:"max_us"`
	ServerCPU     float64         `json:"server_cpu_s,omitempty"`
	PerCPUSecond  float64         `json:"decisions_per_cpu_s,omitempty"`
	NsPerDecision float64         `json:"ns_per_decision,omitempty"`
	Boundary      *boundaryResult `json:"boundary,omitempty"`
}

type config struct {
	addrs       []string
	name, key   string
	limit       int64
	duration    time.Duration
	concurrency int
	rate        float64
	dur, warmup time.Duration
	pids        []int
	boundary    time.Duration
	burst       int
	offset      time.Duration
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("gubernator-bench", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:18460", "Gubernator gRPC addresses, comma-separated (calls go round-robin)")
	c := config{}
	fs.StringVar(&c.name, "name", "bench", "rate limit name")
	fs.StringVar(&c.key, "key", "ingest", "unique key")
	fs.Int64Var(&c.limit, "limit", 1000000, "token bucket limit per --window")
	fs.DurationVar(&c.duration, "window", time.Second, "token bucket duration")
	fs.IntVar(&c.concurrency, "concurrency", 32, "calls in flight")
	fs.Float64Var(&c.rate, "rate", 0, "open loop: calls per second on a fixed schedule (0 = closed loop)")
	fs.DurationVar(&c.dur, "duration", 5*time.Second, "measured span")
	fs.DurationVar(&c.warmup, "warmup", 0, "calls before the measured span")
	pids := fs.String("pid", "", "server process ids whose CPU is counted, comma-separated")
	fs.DurationVar(&c.boundary, "boundary", 0, "boundary test: window length (bursts either side of a boundary)")
	fs.IntVar(&c.burst, "burst", 0, "boundary test: calls in each burst")
	fs.DurationVar(&c.offset, "offset", 300*time.Millisecond, "boundary test: bursts this far before and after the boundary")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, a := range strings.Split(*addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.addrs = append(c.addrs, a)
		}
	}
	if len(c.addrs) == 0 {
		return c, errors.New("--addr: at least one address is needed")
	}
	if c.limit <= 0 {
		return c, fmt.Errorf("--limit: must be positive, got %d", c.limit)
	}
	if c.duration < time.Millisecond {
		return c, fmt.Errorf("--window: must be at least 1ms, got %s", c.duration)
	}
	if c.concurrency <= 0 {
		return c, fmt.Errorf("--concurrency: must be positive, got %d", c.concurrency)
	}
	if c.rate < 0 {
		return c, fmt.Errorf("--rate: must not be negative, got %g", c.rate)
	}
	if c.boundary > 0 && c.burst <= 0 {
		return c, errors.New("--burst: must be positive with --boundary")
	}
	if c.boundary > 0 && c.offset >= c.boundary {
		return c, fmt.Errorf("--offset: must be shorter than --boundary (%s), got %s", c.boundary, c.offset)
	}
	if *pids != "" {
		for _, p := range strings.Split(*pids, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n <= 0 {
				return c, fmt.Errorf("--pid: %q is not a process id", p)
			}
			c.pids = append(c.pids, n)
		}
	}
	return c, nil
}

// procCPU returns user + system CPU seconds of a process from /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15, in clock ticks of
// 1/100 s on Linux) after the command name, which may hold spaces.
func parseStatCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no ')' after the command name")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want ≥ 13", len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat utime: %w", err)
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat stime: %w", err)
	}
	return float64(u+s) / 100, nil
}

func cpuOf(pids []int) (float64, error) {
	var t float64
	for _, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			return 0, err
		}
		t += c
	}
	return t, nil
}

// percentile of sorted durations, in µs.
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i]) / float64(time.Microsecond)
}

type bench struct {
	cfg     config
	clients []guber.V1Client
	next    atomic.Uint64
	calls   atomic.Int64
	ok      atomic.Int64
	over    atomic.Int64
	errs    atomic.Int64
	firstMu sync.Mutex
	first   string
}

// call makes one decision of one hit; it reports whether it was admitted.
func (b *bench) call(ctx context.Context, key string, limit int64) (bool, error) {
	cl := b.clients[b.next.Add(1)%uint64(len(b.clients))]
	resp, err := cl.GetRateLimits(ctx, &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{{
		Name: b.cfg.name, UniqueKey: key, Hits: 1, Limit: limit,
		Duration: b.cfg.duration.Milliseconds(), Algorithm: guber.Algorithm_TOKEN_BUCKET,
	}}})
	if err == nil && len(resp.Responses) != 1 {
		err = fmt.Errorf("%d responses to one request", len(resp.Responses))
	}
	if err == nil && resp.Responses[0].Error != "" {
		err = errors.New(resp.Responses[0].Error)
	}
	if err != nil {
		return false, err
	}
	return resp.Responses[0].Status == guber.Status_UNDER_LIMIT, nil
}

func (b *bench) record(ctx context.Context, key string, limit int64, measured bool) bool {
	admitted, err := b.call(ctx, key, limit)
	if !measured {
		return admitted
	}
	b.calls.Add(1)
	switch {
	case err != nil:
		b.errs.Add(1)
		b.firstMu.Lock()
		if b.first == "" {
			b.first = err.Error()
		}
		b.firstMu.Unlock()
	case admitted:
		b.ok.Add(1)
	default:
		b.over.Add(1)
	}
	return err == nil && admitted
}

func (b *bench) run(ctx context.Context) (result, error) {
	c := b.cfg
	r := result{Target: strings.Join(c.addrs, ",")}
	if c.boundary > 0 {
		return b.runBoundary(ctx, r)
	}
	var lat [][]time.Duration = make([][]time.Duration, c.concurrency)
	var cpu0, cpu1 float64
	var start, end time.Time
	var err error
	if c.rate == 0 {
		r.Mode = "closed"
		if c.warmup > 0 {
			b.closed(ctx, time.Now().Add(c.warmup), nil, false)
		}
		if cpu0, err = cpuOf(c.pids); err != nil {
			return r, err
		}
		start = time.Now()
		b.closed(ctx, start.Add(c.dur), lat, true)
		end = time.Now()
	} else {
		r.Mode, r.OfferedPerS = "open", c.rate
		interval := time.Duration(float64(time.Second) / c.rate)
		n := int(c.dur.Seconds() * c.rate)
		w := int(c.warmup.Seconds() * c.rate)
		sched := make(chan time.Time, n+w)
		t0 := time.Now().Add(10 * time.Millisecond)
		var wg sync.WaitGroup
		var measuredFrom time.Time = t0.Add(time.Duration(w) * interval)
		for i := 0; i < c.concurrency; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				for at := range sched {
					time.Sleep(time.Until(at))
					m := !at.Before(measuredFrom)
					b.record(ctx, c.key, c.limit, m)
					if m {
						lat[i] = append(lat[i], time.Since(at))
					}
				}
			}(i)
		}
		cpuTaken := false
		for k := 0; k < n+w; k++ {
			at := t0.Add(time.Duration(k) * interval)
			if k == w {
				time.Sleep(time.Until(at))
				if cpu0, err = cpuOf(c.pids); err != nil {
					return r, err
				}
				cpuTaken = true
			}
			sched <- at
		}
		close(sched)
		if !cpuTaken {
			cpu0, _ = cpuOf(c.pids)
		}
		wg.Wait()
		start, end = measuredFrom, time.Now()
	}
	if cpu1, err = cpuOf(c.pids); err != nil {
		return r, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	r.Calls, r.OK, r.OverLimit, r.Errors, r.FirstError = b.calls.Load(), b.ok.Load(), b.over.Load(), b.errs.Load(), b.first
	r.Seconds = end.Sub(start).Seconds()
	decisions := float64(r.OK + r.OverLimit)
	r.PerS = decisions / r.Seconds
	r.P50us, r.P99us = percentile(all, 0.50), percentile(all, 0.99)
	if len(all) > 0 {
		r.MaxUs = float64(all[len(all)-1]) / float64(time.Microsecond)
	}
	// Sustained: the open loop kept up with its schedule (≥ 97 % of the
	// offered rate over the span), as `tollgate envoybench` judges it.
	r.Sustained = r.Mode == "closed" || r.PerS >= 0.97*c.rate
	if len(c.pids) > 0 {
		r.ServerCPU = cpu1 - cpu0
		if r.ServerCPU > 0 && decisions > 0 {
			r.PerCPUSecond = decisions / r.ServerCPU
			r.NsPerDecision = r.ServerCPU * 1e9 / decisions
		}
	}
	return r, nil
}

func (b *bench) closed(ctx context.Context, until time.Time, lat [][]time.Duration, measured bool) {
	var wg sync.WaitGroup
	for i := 0; i < b.cfg.concurrency; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Now().Before(until) {
				t := time.Now()
				b.record(ctx, b.cfg.key, b.cfg.limit, measured)
				if lat != nil {
					lat[i] = append(lat[i], time.Since(t))
				}
			}
		}(i)
	}
	wg.Wait()
}

// runBoundary sends a burst of --burst calls --offset before a boundary of
// the wall clock's --boundary windows and another --offset after it, on a
// fresh key, and reports admitted ÷ limit. Gubernator's token bucket starts
// at the first hit, not at the wall clock's boundary, so the figure says how
// much it admits over two bursts 2×offset apart.
func (b *bench) runBoundary(ctx context.Context, r result) (result, error) {
	c := b.cfg
	r.Mode = "boundary"
	next := time.Now().Truncate(c.boundary).Add(c.boundary)
	if time.Until(next) < c.offset+50*time.Millisecond {
		next = next.Add(c.boundary)
	}
	burst := func(at time.Time) int64 {
		time.Sleep(time.Until(at))
		var n atomic.Int64
		var wg sync.WaitGroup
		jobs := make(chan struct{}, c.burst)
		for i := 0; i < c.burst; i++ {
			jobs <- struct{}{}
		}
		close(jobs)
		for i := 0; i < c.concurrency; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs {
					if b.record(ctx, c.key, c.limit, true) {
						n.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return n.Load()
	}
	t0 := time.Now()
	before := burst(next.Add(-c.offset))
	if time.Now().After(next) {
		return r, fmt.Errorf("the first burst was not answered before the boundary (%s late)", time.Since(next))
	}
	after := burst(next.Add(c.offset))
	r.Boundary = &boundaryResult{
		UnitSeconds: c.boundary.Seconds(), Limit: int(c.limit), Burst: c.burst,
		BeforeOK: before, AfterOK: after, Admitted: float64(before+after) / float64(c.limit),
		SpanMs: float64(time.Since(t0)) / float64(time.Millisecond),
	}
	r.Calls, r.OK, r.OverLimit, r.Errors, r.FirstError = b.calls.Load(), b.ok.Load(), b.over.Load(), b.errs.Load(), b.first
	return r, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "gubernator-bench:", err)
		os.Exit(2)
	}
	b := &bench{cfg: cfg}
	for _, a := range cfg.addrs {
		cl, err := guber.DialV1Server(a, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gubernator-bench: dial", a+":", err)
			os.Exit(1)
		}
		b.clients = append(b.clients, cl)
	}
	r, err := b.run(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gubernator-bench:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "gubernator-bench:", err)
		os.Exit(1)
	}
}
