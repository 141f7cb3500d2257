package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/spf13/cobra"
)

// rwbenchOpts are the flags of `tollgate rwbench`.
type rwbenchOpts struct {
	url, baseline    string
	tenants          int
	seriesPerTenant  int
	seriesPerRequest int
	concurrency      int
	duration         time.Duration
	rounds           int
	rate             float64
	tenantHeader     string
	asJSON           bool
	requestTimeout   time.Duration
	metricName       string
}

// rwbenchResult is one run against one URL.
type rwbenchResult struct {
	Target        string         `json:"target"`
	Round         int            `json:"round"`
	Requests      int64          `json:"requests"`
	Samples       int64          `json:"samples_ok"`
	SamplesPerSec float64        `json:"samples_per_sec"`
	P50ms         float64        `json:"p50_ms"`
	P99ms         float64        `json:"p99_ms"`
	Codes         map[string]int `json:"codes"`
}

func newRWBenchCmd() *cobra.Command {
	o := rwbenchOpts{}
	cmd := &cobra.Command{
		Use:   "rwbench",
		Short: "Remote-write load generator: samples/s and latency through a URL, optionally interleaved with a baseline URL",
		Long: `Send Prometheus remote write 1.0 requests (snappy protobuf, one sample per
series, --series-per-request series each) for --tenants tenants of
--series-per-tenant series, from --concurrency workers, for --duration; print
the samples per second answered 2xx and the request latency.

With --baseline-url, runs alternate between --url and the baseline for
--rounds rounds each (interleaved, so load from elsewhere on the machine hits
both alike) and the summary gives the medians and the ratio url/baseline:
point --url at a gateway and --baseline-url at the receiver behind it.

Each worker owns its series and stamps them with increasing timestamps, so a
Prometheus receiver accepts every sample (no out-of-order or duplicates).
--rate (samples/s, all workers together) makes the load open-loop.`,
		Example: `  tollgate rwbench --url http://127.0.0.1:7390/api/v1/push --baseline-url http://127.0.0.1:9090/api/v1/write --rounds 3`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRWBench(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "", "remote-write URL to load (required)")
	f.StringVar(&o.baseline, "baseline-url", "", "a second URL, run alternately with --url (e.g. the receiver behind a gateway)")
	f.IntVar(&o.tenants, "tenants", 4, "tenants (sent in --tenant-header as rwbench-0, rwbench-1, …)")
	f.IntVar(&o.seriesPerTenant, "series-per-tenant", 10000, "series per tenant")
	f.IntVar(&o.seriesPerRequest, "series-per-request", 500, "series (one sample each) per request; Prometheus sends up to 2000 by default")
	f.IntVar(&o.concurrency, "concurrency", 8, "workers, each with one request in flight")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "length of one run")
	f.IntVar(&o.rounds, "rounds", 1, "runs per URL")
	f.Float64Var(&o.rate, "rate", 0, "samples/s offered by all workers together (0: as fast as answered)")
	f.StringVar(&o.tenantHeader, "tenant-header", "X-Scope-OrgID", "header naming the tenant")
	f.DurationVar(&o.requestTimeout, "request-timeout", 10*time.Second, "bound of one request")
	f.StringVar(&o.metricName, "metric", "rwbench_series", "metric name of the generated series")
	f.BoolVar(&o.asJSON, "json", false, "print the runs and the summary as JSON")
	return cmd
}

func runRWBench(ctx context.Context, out io.Writer, o rwbenchOpts) error {
	if o.url == "" {
		return fmt.Errorf("--url is required")
	}
	if o.tenants < 1 || o.seriesPerTenant < 1 || o.seriesPerRequest < 1 || o.concurrency < 1 || o.rounds < 1 || o.duration <= 0 {
		return fmt.Errorf("--tenants, --series-per-tenant, --series-per-request, --concurrency, --rounds and --duration must be positive")
	}
	// Blocks: seriesPerRequest consecutive series of one tenant; worker w
	// owns blocks w, w+C, … so each series has one writer.
	type block struct {
		tenant string
		series []prompb.TimeSeries
	}
	var blocks []block
	for t := range o.tenants {
		tenant := "rwbench-" + strconv.Itoa(t)
		for start := 0; start < o.seriesPerTenant; start += o.seriesPerRequest {
			b := block{tenant: tenant}
			for i := start; i < min(start+o.seriesPerRequest, o.seriesPerTenant); i++ {
				b.series = append(b.series, prompb.TimeSeries{
					Labels: []prompb.Label{{Name: "__name__", Value: o.metricName}, {Name: "instance", Value: "rwbench"},
						{Name: "series", Value: strconv.Itoa(i)}, {Name: "tenant", Value: tenant}},
					Samples: []prompb.Sample{{}},
				})
			}
			blocks = append(blocks, b)
		}
	}
	if len(blocks) < o.concurrency {
		o.concurrency = len(blocks)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = o.concurrency * 2
	client := &http.Client{Transport: tr, Timeout: o.requestTimeout}
	lastTS := make([]int64, o.concurrency)

	run := func(target string, round int) rwbenchResult {
		res := rwbenchResult{Target: target, Round: round, Codes: map[string]int{}}
		var mu sync.Mutex
		var lats []time.Duration
		rctx, cancel := context.WithTimeout(ctx, o.duration)
		defer cancel()
		start := time.Now()
		var wg sync.WaitGroup
		for w := range o.concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []int
				for b := w; b < len(blocks); b += o.concurrency {
					mine = append(mine, b)
				}
				var myLats []time.Duration
				codes := map[string]int{}
				var ok, reqs int64
				perWorker := o.rate / float64(o.concurrency)
				due := time.Now()
				for k := 0; rctx.Err() == nil; k++ {
					b := &blocks[mine[k%len(mine)]]
					if perWorker > 0 {
						if d := time.Until(due); d > 0 {
							select {
							case <-time.After(d):
							case <-rctx.Done():
							}
							if rctx.Err() != nil {
								break
							}
						}
						due = due.Add(time.Duration(float64(len(b.series)) / perWorker * float64(time.Second)))
					}
					ts := max(time.Now().UnixMilli(), lastTS[w]+1)
					lastTS[w] = ts
					for i := range b.series {
						b.series[i].Samples[0] = prompb.Sample{Value: float64(k), Timestamp: ts}
					}
					raw, err := (&prompb.WriteRequest{Timeseries: b.series}).Marshal()
					if err != nil {
						codes["encode"]++
						continue
					}
					body := snappy.Encode(nil, raw)
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/x-protobuf")
					req.Header.Set("Content-Encoding", "snappy")
					req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
					req.Header.Set(o.tenantHeader, b.tenant)
					t0 := time.Now()
					resp, err := client.Do(req)
					lat := time.Since(t0)
					reqs++
					if err != nil {
						codes["error"]++
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[strconv.Itoa(resp.StatusCode)]++
					if resp.StatusCode/100 == 2 {
						ok += int64(len(b.series))
						myLats = append(myLats, lat)
					}
				}
				mu.Lock()
				res.Requests += reqs
				res.Samples += ok
				lats = append(lats, myLats...)
				for c, n := range codes {
					res.Codes[c] += n
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		res.SamplesPerSec = float64(res.Samples) / el
		slices.Sort(lats)
		if len(lats) > 0 {
			res.P50ms = float64(lats[len(lats)/2].Microseconds()) / 1000
			res.P99ms = float64(lats[min(len(lats)-1, len(lats)*99/100)].Microseconds()) / 1000
		}
		return res
	}

	var results []rwbenchResult
	for r := range o.rounds {
		targets := []string{o.url}
		if o.baseline != "" {
			targets = append(targets, o.baseline)
			if r%2 == 1 { // alternate which goes first
				targets[0], targets[1] = targets[1], targets[0]
			}
		}
		for _, tgt := range targets {
			if ctx.Err() != nil {
				break
			}
			res := run(tgt, r)
			results = append(results, res)
			if !o.asJSON {
				fmt.Fprintf(out, "round %d %-50s %10.0f samples/s  p50 %6.2f ms  p99 %6.2f ms  requests %d  codes %v\n",
					r, tgt, res.SamplesPerSec, res.P50ms, res.P99ms, res.Requests, res.Codes)
			}
		}
	}
	med := func(target string, f func(rwbenchResult) float64) float64 {
		var v []float64
		for _, r := range results {
			if r.Target == target {
				v = append(v, f(r))
			}
		}
		if len(v) == 0 {
			return 0
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	rate := func(r rwbenchResult) float64 { return r.SamplesPerSec }
	p99 := func(r rwbenchResult) float64 { return r.P99ms }
	summary := map[string]any{"url_samples_per_sec": med(o.url, rate), "url_p99_ms": med(o.url, p99)}
	if o.baseline != "" {
		b := med(o.baseline, rate)
		summary["baseline_samples_per_sec"] = b
		summary["baseline_p99_ms"] = med(o.baseline, p99)
		if b > 0 {
			summary["ratio"] = med(o.url, rate) / b
		}
	}
	if o.asJSON {
		return json.NewEncoder(out).Encode(map[string]any{"runs": results, "summary": summary})
	}
	fmt.Fprintf(out, "median %s: %.0f samples/s, p99 %.2f ms\n", o.url, summary["url_samples_per_sec"], summary["url_p99_ms"])
	if o.baseline != "" {
		fmt.Fprintf(out, "median %s: %.0f samples/s, p99 %.2f ms\n", o.baseline, summary["baseline_samples_per_sec"], summary["baseline_p99_ms"])
		if r, ok := summary["ratio"]; ok {
			fmt.Fprintf(out, "ratio url/baseline: %.2f\n", r)
		}
	}
	for _, r := range results {
		for c := range r.Codes {
			if c[0] != '2' {
				fmt.Fprintf(out, "note: non-2xx answers in round %d against %s: %v\n", r.Round, r.Target, r.Codes)
				break
			}
		}
	}
	return nil
}
