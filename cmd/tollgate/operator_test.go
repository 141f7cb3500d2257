package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/fsm"
)

// lineWatcher collects a process's output lines and tells when one matches.
type lineWatcher struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func watchLines(t *testing.T, cmd *exec.Cmd, stderr bool) *lineWatcher {
	t.Helper()
	w := &lineWatcher{added: make(chan struct{}, 1)}
	pipe, err := cmd.StdoutPipe()
	if stderr {
		pipe, err = cmd.StderrPipe()
	}
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
			select {
			case w.added <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// wait blocks until a line contains s (hang guard: 60s).
func (w *lineWatcher) wait(t *testing.T, s string) string {
	t.Helper()
	guard := time.After(60 * time.Second)
	for {
		w.mu.Lock()
		for _, l := range w.lines {
			if strings.Contains(l, s) {
				w.mu.Unlock()
				return l
			}
		}
		w.mu.Unlock()
		select {
		case <-w.added:
		case <-guard:
			t.Fatalf("no line with %q after 60s; got:\n%s", s, strings.Join(w.all(), "\n"))
		}
	}
}

func (w *lineWatcher) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

// A node that cannot be ready (it waits for a second --bootstrap-expect member
// that never comes) says what it waits for and never prints the ready banner;
// status and list-peers against it report groups without a leader and exit
// non-zero.
func TestNotReadyNodeSaysWhyAndStatusFails(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	grpc := freePort(t)
	cmd := exec.Command(bin, "server", "--node-id", "node-1", "--data-dir", t.TempDir(), "--bootstrap-expect", "2",
		"--grpc-addr", grpc, "--http-addr", "-", "--raft-addr", freePort(t), "--gossip-addr", freePort(t))
	stdout := watchLines(t, cmd, false)
	stderr := watchLines(t, cmd, true)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	stderr.wait(t, "waiting for --bootstrap-expect 2: 1 alive (node-1)")

	out, err := runCLI(t, bin, "status", "--addr", grpc, "--timeout", "20s")
	if err == nil || !strings.Contains(out, "NO LEADER in groups 0,1,2,3") || !strings.Contains(out, "have no leader") {
		t.Fatalf("status on a leaderless cluster: err=%v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "raft", "list-peers", "--addr", grpc, "--timeout", "20s")
	if err == nil || strings.Count(out, "(no leader)") != 4 {
		t.Fatalf("list-peers on a leaderless cluster: err=%v\n%s", err, out)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	for _, l := range stdout.all() {
		if strings.Contains(l, "ready") {
			t.Fatalf("a node that never was ready printed %q", l)
		}
	}
}

// track fails at once, naming the problem, when nothing listens at --addr
// (it must not retry for its whole --timeout).
func TestTrackFailsFastWhenNoServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // hang guard; --timeout is 10m
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "track", "--tenant", "a", "--count", "1", "--timeout", "10m")
	cmd.Env = append(cmd.Environ(), "TOLLGATE_ADDR="+freePort(t))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatal("track kept retrying against an address where nothing listens")
	}
	if err == nil || !strings.Contains(string(out), "no Tollgate node reachable") || !strings.Contains(string(out), "connection refused") {
		t.Fatalf("err=%v\n%s", err, out)
	}
}

// bench against a dev node with default settings: counts add up, nothing is
// rejected below the dev limit, and the layout comes from the server (a
// 16-partition node: a client assuming 64 would send misrouted partitions).
func TestBenchAgainstDevNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, t.TempDir(), addrs, "--partitions", "16")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	cmd := exec.Command(bin, "bench", "--duration", "2s", "--tenants", "2", "--series-per-tenant", "5000", "--concurrency", "2", "--json")
	cmd.Env = append(cmd.Environ(), "TOLLGATE_ADDR="+p.grpc)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var s BenchSummary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if s.Requests == 0 || s.RequestsFailed != 0 || s.Rejected != 0 || s.Sent != s.New+s.Refresh || s.Sent != s.Accepted+s.Rejected+s.Failed {
		t.Fatalf("summary: %+v", s)
	}
	// Every new series accepted in the measured run exists on the server
	// (requests still in flight at the end may have added more).
	if used := usage(t, p, "bench-0") + usage(t, p, "bench-1"); used < s.NewAccepted || s.NewAccepted == 0 {
		t.Fatalf("server holds %d series, bench accepted %d new", used, s.NewAccepted)
	}

	// Open loop: 20,000 series/s in 100-hash requests is 200 requests a
	// second, and the pacer never sends more than the schedule allows
	// however fast the node answers.
	cmd = exec.Command(bin, "bench", "--duration", "2s", "--tenants", "2", "--series-per-tenant", "5000", "--concurrency", "4",
		"--request-size", "100", "--rate", "20000", "--json")
	cmd.Env = append(cmd.Environ(), "TOLLGATE_ADDR="+p.grpc)
	if out, err = cmd.Output(); err != nil {
		t.Fatalf("bench --rate: %v\n%s", err, out)
	}
	s = BenchSummary{}
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if most := int64(s.DurationSec*200) + 1; s.OfferedPerSec != 20000 || s.Requests == 0 || s.Requests > most || s.RequestsFailed != 0 {
		t.Fatalf("open loop at 200 requests/s for %.2fs: %d requests (at most %d), offered %v, %d failed",
			s.DurationSec, s.Requests, most, s.OfferedPerSec, s.RequestsFailed)
	}
	out, err = exec.Command(bin, "bench", "--rate", "-1", "--addr", p.grpc).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--rate") {
		t.Fatalf("bench --rate -1: err=%v\n%s", err, out)
	}
}

// bench --metrics-url reports the node's CPU per series from its own
// process_cpu_seconds_total: positive, per node summing to the total, ns per
// series = CPU / series, the series at least those the summary counts (and at
// most one request per worker more: those in flight at the end), and no more
// cores than the machine has. Text output carries the line; a node that does
// not answer fails the run naming the flag.
func TestBenchCostReport(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, t.TempDir(), addrs, "--partitions", "16")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	const conc, size = 2, 500
	args := []string{"bench", "--addr", p.grpc, "--duration", "2s", "--tenants", "2", "--series-per-tenant", "20000",
		"--concurrency", strconv.Itoa(conc), "--request-size", strconv.Itoa(size), "--metrics-url", p.http}
	out, err := exec.Command(bin, append(args, "--json")...).Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var s BenchSummary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	c := s.Cost
	if c == nil || len(c.Nodes) != 1 || c.Nodes[0].URL != "http://"+p.http+"/metrics" {
		t.Fatalf("cost: %+v\n%s", c, out)
	}
	if c.CPUSeconds <= 0 || c.Series <= 0 || c.NsPerSeries <= 0 || c.IntervalSecs < s.DurationSec {
		t.Fatalf("cost not positive or interval shorter than the run: %+v (run %.2fs)", c, s.DurationSec)
	}
	if c.Series < s.Sent || c.Series > s.Sent+conc*size {
		t.Fatalf("cost counts %d series, the summary %d sent (at most %d in flight at the end)", c.Series, s.Sent, conc*size)
	}
	if want := c.CPUSeconds * 1e9 / float64(c.Series); math.Abs(c.NsPerSeries-want) > 1e-6*want ||
		c.Nodes[0].CPUSeconds != c.CPUSeconds || c.Nodes[0].NsPerSeries != c.NsPerSeries {
		t.Fatalf("ns per series %v, want %v = %v s / %d series; node %+v", c.NsPerSeries, want, c.CPUSeconds, c.Series, c.Nodes[0])
	}
	// process_cpu_seconds_total counts in clock ticks (10 ms): allow two.
	if cores := (c.CPUSeconds - 0.02) / c.IntervalSecs; cores > float64(runtime.NumCPU()) {
		t.Fatalf("the node used %.2f cores on a %d-CPU machine: %+v", cores, runtime.NumCPU(), c)
	}
	out, err = exec.Command(bin, args...).Output()
	if err != nil || !strings.Contains(string(out), "server CPU: ") || !strings.Contains(string(out), " ns per series") {
		t.Fatalf("text summary without the cost line: %v\n%s", err, out)
	}
	// A node that does not answer: the run stops before measuring, naming the flag.
	out, err = exec.Command(bin, "bench", "--addr", p.grpc, "--duration", "1s", "--metrics-url", p.http+","+freePort(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--metrics-url") {
		t.Fatalf("unreachable metrics URL: err=%v\n%s", err, out)
	}
}

// status shows the cluster version of each member and of the cluster, the
// backlog controller, and halted replicas. A dev node writes runtime-config
// entries (cluster version 3), then restarts with TOLLGATE_MAX_CLUSTER_VERSION=2
// on the same data: replaying its log it meets an entry it cannot apply and
// halts the group, which status prints and exits non-zero for.
func TestStatusShowsVersionsAndHalts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, data, addrs)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	a := p.grpc
	cur := fsm.CurrentClusterVersion

	out := mustCLI(t, bin, "status", "--addr", a)
	if want := fmt.Sprintf("cluster version %d (this build supports %d)\n", cur, cur); !strings.Contains(out, want) {
		t.Fatalf("status lacks %q:\n%s", want, out)
	}
	if ver := tableColumn(t, out, "ZONE", 3); len(ver) != 1 || ver[0] != fmt.Sprint(cur) {
		t.Fatalf("VER column %v, want [%d]:\n%s", ver, cur, out)
	}
	if !strings.Contains(out, "backlog controller: off") || strings.Contains(out, "HALTED") {
		t.Fatalf("status of a fresh dev node:\n%s", out)
	}

	mustCLI(t, bin, "limits", "set", "--addr", a, "--global", "backlog_controller.kind=locate", "backlog_controller.target=1000",
		"backlog_controller.period=10s", "backlog_controller.kp=0.5")
	deadline := time.Now().Add(20 * time.Second) // generous: only catches hangs
	for {
		out = mustCLI(t, bin, "status", "--addr", a)
		if strings.Contains(out, "backlog controller (locate) on dev: enabled, output 100% (written ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status does not show the controller enabled:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Restart as a build that supports cluster version 2 only.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
	cmd := exec.Command(bin, "server", "--dev", "--data-dir", data, "--grpc-addr", addrs[0], "--http-addr", addrs[1],
		"--raft-addr", addrs[2], "--log-level", "warn")
	cmd.Env = append(cmd.Environ(), "TOLLGATE_MAX_CLUSTER_VERSION=2")
	stderr := watchLines(t, cmd, true)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	stderr.wait(t, "group halted")
	// Every group holds a config entry (group 0 the patch, the others its
	// install): wait until each has replayed up to it and halted.
	var err error
	deadline = time.Now().Add(60 * time.Second) // only catches hangs
	for {
		out, err = runCLI(t, bin, "status", "--addr", a, "--timeout", "20s")
		if strings.Count(out, "HALTED: group ") == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status does not show the four groups halted: err=%v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil {
		t.Fatalf("status with halted groups exited 0:\n%s", out)
	}
	for _, want := range []string{
		fmt.Sprintf("cluster version 2 (this build supports %d)\n", cur),
		"HALTED: group 0 on dev: raft index ",
		"this build supports cluster version 2",
		"halted replicas: group 0 on dev, group 1 on dev, group 2 on dev, group 3 on dev: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	if ver := tableColumn(t, out, "ZONE", 3); len(ver) != 1 || ver[0] != "2" {
		t.Errorf("VER column %v, want [2]", ver)
	}
	if t.Failed() {
		t.Fatalf("status:\n%s", out)
	}
}

// track and bench with a missing or wrong token: the error names the
// credential, instead of the 10 s "cluster layout not known yet" timeout a
// refused WatchCluster stream used to turn into.
func TestTrackAndBenchReportRefusedToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("right-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startDev(t, bin, filepath.Join(dir, "data"), [3]string{freePort(t), freePort(t), freePort(t)}, "--admin-token-file", tokenFile)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	for _, tc := range []struct {
		name  string
		token string
		args  []string
	}{
		{"track, no token", "", []string{"track", "--tenant", "a", "--count", "1"}},
		{"track, wrong token", "wrong-token", []string{"track", "--tenant", "a", "--count", "1"}},
		{"bench, wrong token", "wrong-token", []string{"bench", "--duration", "2s"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // hang guard
		cmd := exec.CommandContext(ctx, bin, tc.args...)
		cmd.Env = append(os.Environ(), "TOLLGATE_ADDR="+p.grpc, "TOLLGATE_ADMIN_TOKEN="+tc.token)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "refuses this client's credential") || !strings.Contains(string(out), "Unauthenticated") ||
			strings.Contains(string(out), "layout not known yet") {
			t.Errorf("%s: err=%v\n%s", tc.name, err, out)
		}
	}
	// The right token works.
	cmd := exec.Command(bin, "track", "--tenant", "a", "--count", "1")
	cmd.Env = append(os.Environ(), "TOLLGATE_ADDR="+p.grpc, "TOLLGATE_ADMIN_TOKEN=right-token")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "1 accepted") {
		t.Fatalf("right token: %v\n%s", err, out)
	}
}
