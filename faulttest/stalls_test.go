package faulttest

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuHog starts n processes that spin (a shell busy loop each), so that a
// test runs beside load it does not control, as on a busy host; they are
// killed (by their own pids) when the test ends.
func cpuHog(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start CPU hog: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// histogram is one Prometheus histogram scraped from /metrics: cumulative
// counts per upper bound.
type histogram struct {
	bounds []float64
	counts []float64
}

// scrapeHistogram reads histogram name from n's /metrics.
func scrapeHistogram(n *node, name string) (histogram, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tokenTransport{}}).Get("http://" + n.httpAddr + "/metrics")
	if err != nil {
		return histogram{}, err
	}
	defer resp.Body.Close()
	var h histogram
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		q := strings.IndexByte(rest, '"')
		if q < 0 {
			continue
		}
		b, err1 := strconv.ParseFloat(rest[:q], 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(rest[strings.LastIndexByte(rest, ' ')+1:]), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		h.bounds, h.counts = append(h.bounds, b), append(h.counts, c)
	}
	return h, sc.Err()
}

// over is how many observations exceeded d (by bucket: those above the
// first bound ≥ d).
func (h histogram) over(d time.Duration) float64 {
	if len(h.counts) == 0 {
		return 0
	}
	total := h.counts[len(h.counts)-1]
	for i, b := range h.bounds {
		if b >= d.Seconds() {
			return total - h.counts[i]
		}
	}
	return 0
}

// quantile is the upper bound of the bucket holding quantile q.
func (h histogram) quantile(q float64) time.Duration {
	if len(h.counts) == 0 {
		return 0
	}
	total := h.counts[len(h.counts)-1]
	for i, c := range h.counts {
		if c >= q*total {
			if math.IsInf(h.bounds[i], 1) {
				return -1
			}
			return time.Duration(h.bounds[i] * float64(time.Second))
		}
	}
	return -1
}

// max is the upper bound of the highest non-empty bucket.
func (h histogram) max() time.Duration {
	for i := len(h.counts) - 1; i > 0; i-- {
		if h.counts[i] > h.counts[i-1] {
			if math.IsInf(h.bounds[i], 1) {
				return time.Duration(h.bounds[i-1]*float64(time.Second)) + 1 // beyond the last finite bound
			}
			return time.Duration(h.bounds[i] * float64(time.Second))
		}
	}
	if len(h.counts) > 0 && h.counts[0] > 0 {
		return time.Duration(h.bounds[0] * float64(time.Second))
	}
	return 0
}

// fetchTo saves GET url (admin token) to path.
func fetchTo(url, path string, timeout time.Duration) error {
	resp, err := (&http.Client{Timeout: timeout, Transport: tokenTransport{}}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// TestStallsUnderLoad measures what stalls raft's timers on a busy host: a
// 3-node cluster under clientlib load (8 workers) beside TOLLGATE_CPU_HOG
// spinning processes (default 0, so that it disturbs no other package's
// tests in `make test`; 6 holds the load near 8 on 2 cores), for
// TOLLGATE_STALL_DURATION (default 20s). It reports, per node, how long
// runnable goroutines waited for a CPU (the Go scheduler's latency
// histogram: p99, the largest bucket, and how many waits exceeded 100 ms and
// 400 ms, raft's heartbeat timeout), the longest stop-the-world pause, and
// how many elections were started ("heartbeat timeout reached" and
// leadership changes in the logs). With TOLLGATE_PROFILE_DIR set it also
// saves a 5 s execution trace and a 10 s CPU profile of group 0's leader
// there (`go tool trace -pprof=sched|syscall|sync` reads where goroutines
// waited). Figures are logged with the load average, not asserted.
//
//	TOLLGATE_CPU_HOG=6 TOLLGATE_PROFILE_DIR=/tmp/prof go test -count=1 -run TestStallsUnderLoad -v ./faulttest/
func TestStallsUnderLoad(t *testing.T) {
	dur := 20 * time.Second
	if v := os.Getenv("TOLLGATE_STALL_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("TOLLGATE_STALL_DURATION=%q: want a positive duration", v)
		}
		dur = d
	}
	hog := 0
	if v := os.Getenv("TOLLGATE_CPU_HOG"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("TOLLGATE_CPU_HOG=%q: want a count of processes", v)
		}
		hog = n
	}
	c := newCluster(t, clusterOptions{defaultMaxSeries: 0, extraArgs: []string{"--enable-debug-endpoints"}})
	// No limit here (the load must not be refused), so the model can only
	// catch an acknowledged series refused later.
	th := c.recordTracks(map[string]int{"zd-0": 0, "zd-1": 0, "zd-2": 0, "zd-3": 0})
	load := startRecordedLoad(t, c, 8, th)
	defer load.close()
	c.waitBalanced()
	before := map[*node]int{}
	for _, n := range c.nodes {
		before[n] = countLog(t, n, "heartbeat timeout reached")
	}
	base := map[*node]histogram{}
	for _, n := range c.nodes {
		h, err := scrapeHistogram(n, "go_sched_latencies_seconds")
		if err != nil {
			t.Fatal(err)
		}
		base[n] = h
	}
	cpuHog(t, hog)
	run := load.begin(fmt.Sprintf("load beside %d spinning processes", hog))
	if dir := os.Getenv("TOLLGATE_PROFILE_DIR"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		l := c.waitLeader(0, nil)
		if err := fetchTo("http://"+l.httpAddr+"/debug/pprof/trace?seconds=5", filepath.Join(dir, "trace.out"), 30*time.Second); err != nil {
			t.Logf("trace: %v", err)
		}
		if err := fetchTo("http://"+l.httpAddr+"/debug/pprof/profile?seconds=10", filepath.Join(dir, "cpu.pprof"), 40*time.Second); err != nil {
			t.Logf("cpu profile: %v", err)
		}
		t.Logf("trace and CPU profile of %s (group 0's leader) in %s", l.id, dir)
	}
	loadFor(time.Until(run.from.Add(dur)))
	load.end(run)
	loadavg, _ := os.ReadFile("/proc/loadavg")
	p99, nreq := load.p99(run.from, run.to)
	t.Logf("%s; p99 %v over %d requests; load average %s", run, p99.Round(100*time.Microsecond), nreq, strings.TrimSpace(string(loadavg)))
	for _, n := range c.nodes {
		h, err := scrapeHistogram(n, "go_sched_latencies_seconds")
		if err != nil {
			t.Errorf("%s: %v", n.id, err)
			continue
		}
		// Only what happened during the run: subtract the counts before it.
		b := base[n]
		if len(b.counts) == len(h.counts) {
			for i := range h.counts {
				h.counts[i] -= b.counts[i]
			}
		}
		gc, _ := scrapeHistogram(n, "go_sched_pauses_total_gc_seconds")
		other, _ := scrapeHistogram(n, "go_sched_pauses_total_other_seconds")
		// The runtime's buckets are coarse: "past 100 ms" is past the
		// first bucket bound at or above 100 ms (about 117 ms).
		t.Logf("%s: scheduler latency p99 ≤ %v, largest ≤ %v; waits past the 100 ms bucket: %.0f, past the 400 ms bucket: %.0f (of %.0f); longest stop-the-world pause ≤ %v (GC), ≤ %v (other); elections started %d",
			n.id, h.quantile(0.99), h.max(), h.over(100*time.Millisecond), h.over(400*time.Millisecond), h.counts[len(h.counts)-1],
			gc.max(), other.max(), countLog(t, n, "heartbeat timeout reached")-before[n])
	}
	load.close()
	th.check()
	c.checkNoCrashes()
}

// countLog counts the lines of n's log (stderr, every start) containing s.
func countLog(t *testing.T, n *node, s string) int {
	t.Helper()
	data, err := os.ReadFile(n.errPath)
	if err != nil {
		t.Fatalf("read %s's log: %v", n.id, err)
	}
	return strings.Count(string(data), s)
}
