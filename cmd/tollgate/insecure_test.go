package main

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInsecureClusterFlag: `tollgate server` with an admin token in a
// multi-node setup (gossip on, no --dev) and neither a gossip key nor TLS
// exits at once with an error naming the fixes; with --insecure-cluster it
// starts, and its ready banner says it is insecure.
func TestInsecureClusterFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	args := func(extra ...string) []string {
		return append([]string{"server", "--node-id", "node-1", "--data-dir", t.TempDir(), "--bootstrap-expect", "1",
			"--grpc-addr", freePort(t), "--http-addr", "-", "--raft-addr", freePort(t), "--gossip-addr", freePort(t)}, extra...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args()...)
	cmd.Env = append(cmd.Environ(), "TOLLGATE_ADMIN_TOKEN=s3cret")
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("started without a gossip key or TLS (err %v):\n%s", err, out)
	}
	for _, want := range []string{"--gossip-keyring-file", "--insecure-cluster", "tollgate tls gossip-key"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not name %s:\n%s", want, out)
		}
	}

	cmd = exec.Command(bin, args("--insecure-cluster")...)
	cmd.Env = append(cmd.Environ(), "TOLLGATE_ADMIN_TOKEN=s3cret")
	stdout := watchLines(t, cmd, false)
	stderr := watchLines(t, cmd, true)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	stderr.wait(t, "INSECURE CLUSTER")
	stdout.wait(t, "SECURITY: INSECURE CLUSTER")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
}
