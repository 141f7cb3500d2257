package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func runCLI(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

func mustCLI(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := runCLI(t, bin, args...)
	if err != nil {
		t.Fatalf("tollgate %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestSnapshotSaveRestoreCLI drives the snapshot commands against a real server:
// save, a refused restore while the cluster is newer (nothing changes), a refused
// damaged file, a forced restore that rolls back exactly to the snapshot, a
// refused restore into a cluster with another layout, and an offline restore that
// seeds a new data dir.
func TestSnapshotSaveRestoreCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, t.TempDir(), addrs, "--default-max-series", "0")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	file := filepath.Join(t.TempDir(), "backup.tgb")

	mustCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "a", "--count", "2000")
	out := mustCLI(t, bin, "snapshot", "save", "--addr", p.grpc, "-o", file)
	if !strings.Contains(out, "2000 series") {
		t.Fatalf("save output does not report 2000 series:\n%s", out)
	}
	if out := mustCLI(t, bin, "snapshot", "inspect", file); !strings.Contains(out, "valid") {
		t.Fatalf("inspect:\n%s", out)
	}
	mustCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "b", "--count", "1000")

	out, err := runCLI(t, bin, "snapshot", "restore", "--addr", p.grpc, file)
	if err == nil || !strings.Contains(out, "--force") || !strings.Contains(out, "will be lost") {
		t.Fatalf("restore onto newer state without --force: err=%v\n%s", err, out)
	}
	if got := usage(t, p, "b"); got != 1000 {
		t.Fatalf("after refused restore tenant b has %d series, want 1000 (nothing may change)", got)
	}

	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.tgb")
	data[len(data)/2] ^= 0x40
	if err := os.WriteFile(bad, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, bin, "snapshot", "restore", "--force", "--addr", p.grpc, bad)
	if err == nil || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("damaged file: err=%v\n%s", err, out)
	}
	if _, err := runCLI(t, bin, "snapshot", "inspect", bad); err == nil {
		t.Fatal("inspect accepted a damaged file")
	}
	if got := usage(t, p, "b"); got != 1000 {
		t.Fatalf("after refused damaged restore tenant b has %d series, want 1000", got)
	}

	out = mustCLI(t, bin, "snapshot", "restore", "--force", "--addr", p.grpc, file)
	if a, b := usage(t, p, "a"), usage(t, p, "b"); a != 2000 || b != 0 {
		t.Fatalf("after restore: a=%d b=%d, want exactly the snapshot (2000, 0)", a, b)
	}
	// Restore reports the state machine's applied index, the one status
	// shows, not raft's log index. Status can be ahead by what the node wrote
	// since (the metering sampler records each tenant's active series after a
	// leadership change or at a minute boundary), never behind.
	restored := tableColumn(t, out, "RESTORED GROUP", 1)
	raftIx := tableColumn(t, out, "RESTORED GROUP", 3)
	status := tableColumn(t, mustCLI(t, bin, "status", "--addr", p.grpc), "GROUP", 3)
	if len(restored) != 4 || len(status) != 4 || len(raftIx) != 4 {
		t.Fatalf("restore %v (raft %v), status %v", restored, raftIx, status)
	}
	for g := range restored {
		ri, err1 := strconv.ParseUint(restored[g], 10, 64)
		li, err2 := strconv.ParseUint(raftIx[g], 10, 64)
		si, err3 := strconv.ParseUint(strings.TrimPrefix(status[g], "dev="), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || !strings.HasPrefix(status[g], "dev=") {
			t.Fatalf("group %d: restore %q (raft %q), status %q", g, restored[g], raftIx[g], status[g])
		}
		if si < ri || ri > li {
			t.Errorf("group %d: restore says applied index %d (raft log %d), status says %d", g, ri, li, si)
		}
	}

	// Another layout: refused before anything changes.
	addrs32 := [3]string{freePort(t), freePort(t), freePort(t)}
	p32 := startDev(t, bin, t.TempDir(), addrs32, "--partitions", "32")
	defer func() { _ = p32.cmd.Process.Kill(); _ = p32.cmd.Wait() }()
	out, err = runCLI(t, bin, "snapshot", "restore", "--force", "--addr", p32.grpc, file)
	if err == nil || !strings.Contains(out, "partitions=64") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("layout mismatch: err=%v\n%s", err, out)
	}

	// Offline: seed a new data dir and start a node on it.
	dir2 := t.TempDir()
	addrs2 := [3]string{freePort(t), freePort(t), freePort(t)}
	mustCLI(t, bin, "snapshot", "restore", "--offline", "--data-dir", dir2, "--node-id", "dev", "--raft-addr", addrs2[2], file)
	if _, err := runCLI(t, bin, "snapshot", "restore", "--offline", "--data-dir", dir2, "--node-id", "dev", "--raft-addr", addrs2[2], file); err == nil {
		t.Fatal("offline restore into a data dir with state was accepted")
	}
	p2 := startDev(t, bin, dir2, addrs2)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	if a, b := usage(t, p2, "a"), usage(t, p2, "b"); a != 2000 || b != 0 {
		t.Fatalf("node seeded offline: a=%d b=%d, want 2000, 0", a, b)
	}
}

// TestOperatorCommandsCLI runs status and the raft commands against a real dev
// node (admin calls from loopback need no token).
func TestOperatorCommandsCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, t.TempDir(), addrs)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	out := mustCLI(t, bin, "status", "--addr", p.grpc)
	if !strings.Contains(out, "zone-a  dev") || !strings.Contains(out, "0,1,2,3") {
		t.Fatalf("status does not show the dev node leading every group:\n%s", out)
	}
	out = mustCLI(t, bin, "raft", "list-peers", "--addr", p.grpc)
	if strings.Count(out, "Voter") != 4 || strings.Count(out, "true") != 4 {
		t.Fatalf("list-peers: want one leading voter per group:\n%s", out)
	}
	out, err := runCLI(t, bin, "raft", "remove-server", "--addr", p.grpc, "--group", "0", "--id", "dev")
	if err == nil || !strings.Contains(out, "last voter") {
		t.Fatalf("removing the last voter: err=%v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "raft", "add-voter", "--addr", p.grpc, "--id", "x")
	if err == nil || !strings.Contains(out, "--group") {
		t.Fatalf("add-voter without a group: err=%v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "raft", "list-peers", "--addr", p.grpc, "--group", "9")
	if err == nil || !strings.Contains(out, "out of range") {
		t.Fatalf("bad group: err=%v\n%s", err, out)
	}
}

// tableColumn returns column col of the rows of the table whose header line
// starts with header (rows end at the first empty line).
func tableColumn(t *testing.T, out, header string, col int) []string {
	t.Helper()
	var vals []string
	in := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, header+" "):
			in = true
		case in && strings.TrimSpace(l) == "":
			return vals
		case in:
			f := strings.Fields(l)
			if len(f) <= col {
				t.Fatalf("short row %q in:\n%s", l, out)
			}
			vals = append(vals, f[col])
		}
	}
	return vals
}

// TestSnapshotRaisedCLI: a backup of a cluster whose group count was raised
// holds every group, the raised ones too (after the partition moves about
// half the series live there): save on a dev node raised 4 → 8 and
// restarted, inspect names the raise, an online restore rolls back exactly,
// and an offline restore seeds a data dir whose node runs 8 groups with
// every series. A backup of the created groups only would lose the moved
// partitions' series.
func TestSnapshotRaisedCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	p := startDev(t, bin, dir, [3]string{freePort(t), freePort(t), freePort(t)}, "--default-max-series", "0")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	mustCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "a", "--count", "2000")
	mustCLI(t, bin, "groups", "raise", "--addr", p.grpc, "--to", "8")
	waitStatus(t, bin, p, "groups added by a raise: 4 (") // every new group created, then the restart
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("stop after the raise: %v", err)
	}
	p = startDev(t, bin, dir, [3]string{freePort(t), freePort(t), freePort(t)}, "--default-max-series", "0")
	waitStatus(t, bin, p, "partition moves: none pending")
	if got := usage(t, p, "a"); got != 2000 {
		t.Fatalf("after the raise and the moves tenant a has %d series, want 2000", got)
	}

	file := filepath.Join(t.TempDir(), "raised.tgb")
	mustCLI(t, bin, "snapshot", "save", "--addr", p.grpc, "-o", file)
	out := mustCLI(t, bin, "snapshot", "inspect", file)
	if !strings.Contains(out, "groups=8 (raised from 4)") {
		t.Fatalf("inspect of a raised cluster's backup:\n%s", out)
	}
	inRaised := 0
	for i, s := range tableColumn(t, out, "GROUP", 4) { // SERIES per group
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("inspect: group %d series %q", i, s)
		}
		if i >= 4 {
			inRaised += n
		}
	}
	if inRaised == 0 {
		t.Fatalf("the raised groups hold no series in the backup: were the moves done?\n%s", out)
	}
	t.Logf("%d of 2000 series in the raised groups' sections", inRaised)

	mustCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "b", "--count", "500")
	mustCLI(t, bin, "snapshot", "restore", "--force", "--addr", p.grpc, file)
	if a, b := usage(t, p, "a"), usage(t, p, "b"); a != 2000 || b != 0 {
		t.Fatalf("after the online restore: a=%d b=%d, want exactly the snapshot (2000, 0)", a, b)
	}

	dir2 := t.TempDir()
	addrs2 := [3]string{freePort(t), freePort(t), freePort(t)}
	mustCLI(t, bin, "snapshot", "restore", "--offline", "--data-dir", dir2, "--node-id", "dev", "--raft-addr", addrs2[2], file)
	p2 := startDev(t, bin, dir2, addrs2)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	waitStatus(t, bin, p2, "partition moves: none pending (every partition at its owner for 8 groups)")
	if got := usage(t, p2, "a"); got != 2000 {
		t.Fatalf("node seeded offline from the raised backup: tenant a has %d series, want 2000", got)
	}
}

// waitStatus waits until `tollgate status` against p prints want.
func waitStatus(t *testing.T, bin string, p *proc, want string) {
	t.Helper()
	var out string
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if out, err = runCLI(t, bin, "status", "--addr", p.grpc); err == nil && strings.Contains(out, want) {
			return
		}
	}
	t.Fatalf("status never showed %q: %v\n%s", want, err, out)
}
