package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/testports"
)

// buildBinary compiles the tollgate binary once per test run.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tollgate")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("build tollgate: %v", err)
	}
	return bin
}

// ports: this package's range, below the ephemeral range and apart from
// faulttest's (20000–32000), whose nodes restart on their ports while these
// tests run beside them (testports says why not port 0).
var ports = testports.Range{Lo: 10000, Hi: 20000}

// freePort returns a loopback address whose port is free for TCP and UDP
// (gossip needs both).
func freePort(t *testing.T) string {
	t.Helper()
	p, err := ports.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

type proc struct {
	cmd  *exec.Cmd
	grpc string
	http string
}

// startDev runs `tollgate server --dev` and waits for its "ready" banner.
func startDev(t *testing.T, bin, dir string, addrs [3]string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"server", "--dev", "--data-dir", dir, "--grpc-addr", addrs[0], "--http-addr", addrs[1],
		"--raft-addr", addrs[2], "--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "ready") {
				ready <- nil
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- fmt.Errorf("tollgate exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("tollgate not ready after 60s")
	}
	return &proc{cmd: cmd, grpc: addrs[0], http: addrs[1]}
}

func usage(t *testing.T, p *proc, tenant string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/api/v1/tenants/" + tenant)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct {
		Series int64 `json:"series"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		t.Fatal(err)
	}
	return u.Series
}

// TestSIGKILLKeepsAcknowledgedSeries kills a durable dev server with SIGKILL while
// writers are mid-flight, restarts it on the same data dir, and checks that every
// acknowledged series is still there: re-sending them all creates nothing new.
func TestSIGKILLKeepsAcknowledgedSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, dir, addrs, "--default-max-series", "0")

	c, err := clientlib.New(clientlib.Config{Addrs: []string{p.grpc}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	acked := map[int][]uint64{} // partition → acknowledged hashes
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var total int
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			for i := 0; i < 10_000 && ctx.Err() == nil; i++ { // bounded even if the kill never comes
				part := r.IntN(64)
				first, last := api.PartitionHashRange(part, 64)
				hs := make([]uint64, 500)
				for j := range hs {
					hs[j] = first + r.Uint64N(last-first)
				}
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				rej, err := c.TrackPartition(rctx, "kill", part, hs)
				rcancel()
				if err != nil {
					continue // unacknowledged: may or may not be recorded
				}
				if len(rej) != 0 {
					t.Errorf("unlimited tenant got %d rejections", len(rej))
				}
				mu.Lock()
				acked[part] = append(acked[part], hs...)
				total += len(hs)
				mu.Unlock()
			}
		}()
	}
	// Kill once a good amount was acknowledged, with writers still running.
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := total
		mu.Unlock()
		if n >= 50_000 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	cancel()
	wg.Wait()
	if total == 0 {
		t.Fatal("nothing was acknowledged before the kill")
	}

	p = startDev(t, bin, dir, addrs, "--default-max-series", "0")
	defer func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.cmd.Wait()
	}()
	before := usage(t, p, "kill")
	if before < int64(total) {
		t.Fatalf("after restart the tenant holds %d series, fewer than the %d acknowledged", before, total)
	}
	c2, err := clientlib.New(clientlib.Config{Addrs: []string{p.grpc}})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for part, hs := range acked {
		for i := 0; i < len(hs); i += 5000 {
			rej, err := c2.TrackPartition(context.Background(), "kill", part, hs[i:min(len(hs), i+5000)])
			if err != nil || len(rej) != 0 {
				t.Fatalf("re-send after restart: %d rejected, err %v", len(rej), err)
			}
		}
	}
	if after := usage(t, p, "kill"); after != before {
		t.Fatalf("re-sending the %d acknowledged series created %d new ones: they had been lost", total, after-before)
	}
	t.Logf("%d series acknowledged before SIGKILL, %d held after restart (the rest committed without a reply), none lost", total, before)
}
