package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// BenchCost is what the measured run cost the servers: the growth of each
// node's process_cpu_seconds_total between a scrape just before the run and
// one just after it, divided by the series the run sent. Client and server
// share the machine, so throughput and latency partly measure the machine;
// CPU per series is what the server code controls.
//
// Series counts every series of every request that returned between the two
// scrapes, including requests that failed and the requests still in flight
// when the run ended (the summary's counts leave those out, the servers still
// did the work). A node's CPU includes whatever else it did in the interval:
// raft heartbeats, followers' applies, background work.
type BenchCost struct {
	Series       int64      `json:"series"`         // new + refresh, in requests returned between the scrapes
	CPUSeconds   float64    `json:"cpu_seconds"`    // summed over the nodes
	NsPerSeries  float64    `json:"ns_per_series"`  // CPUSeconds·1e9 / Series
	Nodes        []NodeCost `json:"nodes"`          // one per --metrics-url, in flag order
	IntervalSecs float64    `json:"interval_s"`     // wall time between the scrapes
	CPUCores     float64    `json:"cpu_cores_used"` // CPUSeconds / IntervalSecs
}

// NodeCost is one node's share of BenchCost.
type NodeCost struct {
	URL         string  `json:"url"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	NsPerSeries float64 `json:"ns_per_series"`
}

// metricsURL turns a --metrics-url entry into the URL to scrape: host:port
// (the node's --http-addr) or a URL; a URL without a path gets /metrics.
func metricsURL(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("--metrics-url: empty entry")
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("--metrics-url %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--metrics-url %q: want host:port or an http(s) URL", s)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String(), nil
}

// costProbe scrapes the nodes' CPU counters.
type costProbe struct {
	urls    []string
	client  *http.Client
	timeout time.Duration
}

func newCostProbe(entries []string, tlsCfg *tls.Config, timeout time.Duration) (*costProbe, error) {
	p := &costProbe{timeout: timeout, client: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}}
	for _, e := range entries {
		u, err := metricsURL(e)
		if err != nil {
			return nil, err
		}
		if slices.Contains(p.urls, u) {
			// The same node twice would count its CPU twice.
			return nil, fmt.Errorf("--metrics-url %s given twice", u)
		}
		p.urls = append(p.urls, u)
	}
	return p, nil
}

// cpuSnapshot is each node's process_cpu_seconds_total, in URL order, and
// when it was read.
type cpuSnapshot struct {
	at  time.Time
	cpu []float64
}

func (p *costProbe) read(ctx context.Context) (cpuSnapshot, error) {
	s := cpuSnapshot{at: time.Now(), cpu: make([]float64, len(p.urls))}
	for i, u := range p.urls {
		v, err := p.cpuSeconds(ctx, u)
		if err != nil {
			return s, err
		}
		s.cpu[i] = v
	}
	return s, nil
}

func (p *costProbe) cpuSeconds(ctx context.Context, u string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("--metrics-url %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("--metrics-url %s: HTTP %d", u, resp.StatusCode)
	}
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("--metrics-url %s: %w", u, err)
	}
	v, ok := m["process_cpu_seconds_total"]
	if !ok {
		return 0, fmt.Errorf("--metrics-url %s: no process_cpu_seconds_total (not a Tollgate node, or a platform without process metrics)", u)
	}
	return v, nil
}

// benchCost is the cost of the interval from a to b for series series.
func benchCost(urls []string, a, b cpuSnapshot, series int64) *BenchCost {
	c := &BenchCost{Series: series, IntervalSecs: b.at.Sub(a.at).Seconds()}
	perSeries := func(cpu float64) float64 {
		if series <= 0 {
			return 0
		}
		return cpu * 1e9 / float64(series)
	}
	for i, u := range urls {
		d := b.cpu[i] - a.cpu[i]
		c.CPUSeconds += d
		c.Nodes = append(c.Nodes, NodeCost{URL: u, CPUSeconds: d, NsPerSeries: perSeries(d)})
	}
	c.NsPerSeries = perSeries(c.CPUSeconds)
	if c.IntervalSecs > 0 {
		c.CPUCores = c.CPUSeconds / c.IntervalSecs
	}
	return c
}

func printBenchCost(out io.Writer, c *BenchCost) {
	fmt.Fprintf(out, "  server CPU: %.2f s over %.1fs (%.2f cores) for %d series: %.0f ns per series",
		c.CPUSeconds, c.IntervalSecs, c.CPUCores, c.Series, c.NsPerSeries)
	if len(c.Nodes) > 1 {
		var parts []string
		for _, n := range c.Nodes {
			parts = append(parts, fmt.Sprintf("%s %.2f s %.0f ns", n.URL, n.CPUSeconds, n.NsPerSeries))
		}
		fmt.Fprintf(out, " (%s)", strings.Join(parts, "; "))
	}
	fmt.Fprintln(out)
}
