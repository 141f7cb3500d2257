package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// promTarget is a scrape target on loopback exposing n series load_value{n}
// and counting the scrapes it answered; once stopped it answers 503, so the
// scraper appends no further sample of those series.
type promTarget struct {
	srv     *httptest.Server
	scrapes atomic.Int64
	stopped atomic.Bool
}

func newPromTarget(t *testing.T, n int) *promTarget {
	pt := &promTarget{}
	pt.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if pt.stopped.Load() {
			http.Error(w, "stopped", http.StatusServiceUnavailable)
			return
		}
		var b strings.Builder
		b.WriteString("# TYPE load_value gauge\n")
		for i := range n {
			fmt.Fprintf(&b, "load_value{n=\"%d\"} %d\n", i, i)
		}
		pt.scrapes.Add(1)
		io.WriteString(w, b.String())
	}))
	t.Cleanup(pt.srv.Close)
	return pt
}

// startProcess runs a command, its output in the test log's files, and
// kills it (SIGKILL) when the test ends unless it was stopped before.
func startProcess(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	logf, err := os.Create(filepath.Join(t.TempDir(), filepath.Base(name)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s %s output (tail):\n%s", name, args[0], b)
		}
	})
	return cmd
}

func waitHTTP(t *testing.T, url string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v (last: %v)", url, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startGatewayProc runs `tollgate gateway` and waits for its banner.
func startGatewayProc(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"gateway", "--log-level", "warn"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	banner := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := sc.Scan() && strings.Contains(sc.Text(), "tollgate gateway:")
		banner <- ok
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case ok := <-banner:
		if !ok {
			t.Fatal("tollgate gateway exited before its banner")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tollgate gateway: no banner after 30s")
	}
	return cmd
}

// agentCounter is the sum of a counter's series on a Prometheus' own
// /metrics (0 when absent).
func agentCounter(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// promQuery runs an instant query on a Prometheus and returns each result's
// labels (as a string) and value.
func promQuery(t *testing.T, base, q string) map[string]string {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string
		Data   struct {
			Result []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Status != "success" {
		t.Fatalf("query %s: %v (status %q)", q, err, out.Status)
	}
	res := map[string]string{}
	for _, r := range out.Data.Result {
		res[fmt.Sprint(r.Metric)] = fmt.Sprint(r.Value[1])
	}
	return res
}

// TestGatewayWithPrometheus: real Prometheus agents remote-write through
// `tollgate gateway` (a real process) to a real Prometheus receiver, against
// a real dev server. The tenant offered 55 series (50 of the target, 5 of
// the scrape itself) with max_series 30 ends with exactly 30 in the
// receiver, and every accepted load series holds one sample per scrape the
// target answered; the tenant under its limit holds all 55, each load series
// with every sample. The gateway is SIGKILLed and restarted mid-run: the
// agents retry (their retried-samples counters grow), the agent under its
// limit drops nothing, the accepted series are the same before and after,
// and every retried sample is in.
func TestGatewayWithPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs Prometheus; skipped with -short")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian: apt-get install prometheus): the real-Prometheus gateway test needs it")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte("tenants:\n  small:\n    max_series: 30\n  big:\n    max_series: 1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tg := startDev(t, bin, filepath.Join(dir, "tollgate"), [3]string{freePort(t), freePort(t), freePort(t)}, "--limits-file", limits)
	t.Cleanup(func() { _ = tg.cmd.Process.Kill(); _ = tg.cmd.Wait() })

	// The receiver.
	recvAddr := freePort(t)
	recvCfg := filepath.Join(dir, "receiver.yml")
	if err := os.WriteFile(recvCfg, []byte("global:\n  scrape_interval: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startProcess(t, prom, "--config.file="+recvCfg, "--storage.tsdb.path="+filepath.Join(dir, "receiver"),
		"--web.listen-address="+recvAddr, "--web.enable-remote-write-receiver", "--log.level=warn")
	recv := "http://" + recvAddr
	waitHTTP(t, recv+"/-/ready", 60*time.Second)

	// One gateway per tenant, each with --default-tenant: Debian's
	// Prometheus 2.42 parses remote_write "headers" but does not send them
	// (seen on the wire: only User-Agent, Content-Encoding, Content-Type and
	// the remote-write version arrive), so the agents cannot name their
	// tenant in X-Scope-OrgID. The header path is tested in package gateway.
	gwAddrs, gwArgs, gws := map[string]string{}, map[string][]string{}, map[string]*exec.Cmd{}
	for _, tenant := range []string{"small", "big"} {
		gwAddrs[tenant] = freePort(t)
		gwArgs[tenant] = []string{"--listen", gwAddrs[tenant], "--addr", tg.grpc, "--upstream", recv + "/api/v1/write",
			"--default-tenant", tenant}
		gws[tenant] = startGatewayProc(t, bin, gwArgs[tenant]...)
	}

	// Two agents, one per tenant, each scraping its own target every 500ms.
	targets := map[string]*promTarget{"small": newPromTarget(t, 50), "big": newPromTarget(t, 50)}
	agents, agentURLs := map[string]*exec.Cmd{}, map[string]string{}
	for tenant, pt := range targets {
		cfg := fmt.Sprintf(`global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
  external_labels: {tenant: %s}
scrape_configs:
  - job_name: load
    static_configs: [{targets: ['%s']}]
remote_write:
  - url: http://%s/api/v1/push
    headers: {X-Scope-OrgID: %s}
    queue_config: {batch_send_deadline: 200ms, min_backoff: 50ms, max_backoff: 500ms}
`, tenant, strings.TrimPrefix(pt.srv.URL, "http://"), gwAddrs[tenant], tenant)
		f := filepath.Join(dir, "agent-"+tenant+".yml")
		if err := os.WriteFile(f, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		addr := freePort(t)
		agents[tenant] = startProcess(t, prom, "--enable-feature=agent", "--config.file="+f,
			"--storage.agent.path="+filepath.Join(dir, "agent-"+tenant), "--web.listen-address="+addr, "--log.level=warn")
		agentURLs[tenant] = "http://" + addr
		waitHTTP(t, agentURLs[tenant]+"/-/ready", 60*time.Second)
	}

	// Wait until both tenants' series reach the receiver, then kill the
	// gateway and start it again on the same address.
	waitSeries := func(q string, want int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for len(promQuery(t, recv, q)) < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: fewer than %d series after 60s", q, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitSeries(`last_over_time({tenant="big"}[1h])`, 55)
	waitSeries(`last_over_time({tenant="small"}[1h])`, 30)
	time.Sleep(2 * time.Second)
	// The series accepted before the kill: the same ones must be there at
	// the end, and no other.
	acceptedBefore := promQuery(t, recv, `last_over_time({tenant="small"}[1h])`)
	retriedBefore := map[string]float64{}
	for tenant, u := range agentURLs {
		retriedBefore[tenant] = agentCounter(t, u, "prometheus_remote_storage_samples_retried_total")
	}
	for _, tenant := range []string{"small", "big"} {
		if err := gws[tenant].Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = gws[tenant].Wait()
	}
	time.Sleep(2 * time.Second) // the agents meet a refused connection and retry
	for _, tenant := range []string{"small", "big"} {
		startGatewayProc(t, bin, gwArgs[tenant]...)
	}
	time.Sleep(3 * time.Second)

	// Stop the targets: no more load samples; let the agents' queues drain
	// into the receiver (each load series must end with one sample per
	// answered scrape).
	for _, pt := range targets {
		pt.stopped.Store(true)
	}
	time.Sleep(time.Second) // a scrape answered just before the stop has counted itself
	scrapes := map[string]int64{}
	for tenant, pt := range targets {
		scrapes[tenant] = pt.scrapes.Load()
	}
	counts := func(tenant string) map[string]string {
		return promQuery(t, recv, fmt.Sprintf(`count_over_time(load_value{tenant=%q}[1h])`, tenant))
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		done := true
		for tenant := range targets {
			for _, v := range counts(tenant) {
				if v != fmt.Sprint(scrapes[tenant]) {
					done = false
				}
			}
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Distinct series ever written, from the receiver's index.
	seriesOf := func(tenant string) int {
		return len(promQuery(t, recv, fmt.Sprintf(`last_over_time({tenant=%q}[1h])`, tenant)))
	}
	if n := seriesOf("small"); n != 30 {
		t.Errorf("tenant small (max_series 30, offered 55): the receiver holds %d series, want exactly 30", n)
	}
	acceptedAfter := promQuery(t, recv, `last_over_time({tenant="small"}[1h])`)
	for s := range acceptedBefore {
		if _, ok := acceptedAfter[s]; !ok {
			t.Errorf("tenant small: %s was accepted before the gateway was killed and is gone after", s)
		}
	}
	for s := range acceptedAfter {
		if _, ok := acceptedBefore[s]; !ok {
			t.Errorf("tenant small: %s was accepted only after the gateway was killed", s)
		}
	}
	// The agents did retry across the kill (so the checks above and below
	// are about retried samples), and the agent under its limit dropped
	// nothing: every failure it met was retried until accepted. (small's
	// agent drops the batches answered 400, the series over the limit.)
	retried := map[string]float64{}
	for tenant, u := range agentURLs {
		r := agentCounter(t, u, "prometheus_remote_storage_samples_retried_total")
		retried[tenant] = r - retriedBefore[tenant]
		if r <= retriedBefore[tenant] {
			t.Errorf("tenant %s: the agent retried no sample across the gateway's SIGKILL (%v before, %v after)", tenant, retriedBefore[tenant], r)
		}
	}
	if f := agentCounter(t, agentURLs["big"], "prometheus_remote_storage_samples_failed_total"); f != 0 {
		t.Errorf("tenant big: the agent dropped %v samples as failed, want 0", f)
	}
	if n := seriesOf("big"); n != 55 {
		t.Errorf("tenant big (under its limit, offered 55): the receiver holds %d series, want 55", n)
	}
	for tenant, want := range map[string]int{"small": 1, "big": 50} {
		c := counts(tenant)
		if tenant == "small" && (len(c) == 0 || len(c) > 30) {
			t.Errorf("tenant small: %d load series in the receiver", len(c))
		}
		if tenant == "big" && len(c) != want {
			t.Errorf("tenant big: %d load series in the receiver, want %d", len(c), want)
		}
		for s, v := range c {
			if v != fmt.Sprint(scrapes[tenant]) {
				t.Errorf("tenant %s: %s holds %s samples, want one per answered scrape (%d)", tenant, s, v, scrapes[tenant])
			}
		}
	}
	t.Logf("scrapes answered: %v; the gateway was SIGKILLed and restarted mid-run, samples the agents retried across it: %v", scrapes, retried)
	for _, a := range agents {
		_ = a.Process.Signal(syscall.SIGTERM)
	}
}
