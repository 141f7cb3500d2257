package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
}
