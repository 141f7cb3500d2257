package main

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// groups raise on a dev node: 4 → 6 creates groups 4 and 5 while the node
// runs; it leads them, the partition moves run and status shows none
// pending, without a restart; the same count again changes nothing;
// lowering and a missing --to are clear errors. A restart comes back with 6
// groups and the moves done.
func TestGroupsRaiseCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	p := startDev(t, bin, dir, [3]string{freePort(t), freePort(t), freePort(t)})
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	out, err := runCLI(t, bin, "groups", "raise", "--addr", p.grpc, "--to", "6")
	if err != nil || !strings.Contains(out, "group count raised from 4 to 6") {
		t.Fatalf("groups raise --to 6: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err = runCLI(t, bin, "status", "--addr", p.grpc)
		if err == nil && strings.Contains(out, "groups added by a raise: 2 (2 with a leader") &&
			strings.Contains(out, "partition moves: none pending (every partition at its owner for 6 groups)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed both new groups led and the moves done, without a restart: %v\n%s", err, out)
		}
	}
	if !strings.Contains(out, "64 partitions, 4 groups, raised to 6") || !strings.Contains(out, "group 4: leader ") ||
		strings.Contains(out, "not leading the raised groups yet") {
		t.Fatalf("status lacks the new groups' lines:\n%s", out)
	}
	out, err = runCLI(t, bin, "groups", "raise", "--addr", p.grpc, "--to", "6")
	if err != nil || !strings.Contains(out, "already runs 6 groups: nothing changed") {
		t.Fatalf("groups raise --to 6 again: %v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "groups", "raise", "--addr", p.grpc, "--to", "3")
	if err == nil || !strings.Contains(out, "only be raised") {
		t.Fatalf("groups raise --to 3: %v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "groups", "raise", "--addr", p.grpc)
	if err == nil || !strings.Contains(out, "--to is required") {
		t.Fatalf("groups raise without --to: %v\n%s", err, out)
	}

	// A graceful stop, and a restart over the same data dir with the same
	// flags (groups 4): the node comes back running 6 groups.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("stop after a raise: %v", err)
	}
	p = startDev(t, bin, dir, [3]string{freePort(t), freePort(t), freePort(t)})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err = runCLI(t, bin, "status", "--addr", p.grpc)
		if err == nil && strings.Contains(out, "group 5: leader ") && strings.Contains(out, "partition moves: none pending (every partition at its owner for 6 groups)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after the restart never showed the moves done: %v\n%s", err, out)
		}
	}
	if strings.Contains(out, "not leading the raised groups yet") {
		t.Fatalf("status names a node not leading the raised groups after the restart:\n%s", out)
	}
}
