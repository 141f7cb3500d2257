package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// configVersion reads the version `tollgate limits get` prints.
func configVersion(t *testing.T, bin, addr string) uint64 {
	t.Helper()
	out := mustCLI(t, bin, "limits", "get", "--addr", addr)
	m := regexp.MustCompile(`(?m)^version: (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no version in:\n%s", out)
	}
	v, _ := strconv.ParseUint(m[1], 10, 64)
	return v
}

func waitVersion(t *testing.T, bin, addr string, cond func(uint64) bool) uint64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := configVersion(t, bin, addr)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("config version stuck at %d", v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeYAML(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLimitsCLI drives `tollgate limits` against a real node started with a
// limits file: the file becomes version 1; set, diff and apply make new
// versions; bad values are refused naming the field with nothing applied; a
// stale apply is refused; a restart with the same file does not re-propose
// it; a snapshot restore brings the config back under a new version.
func TestLimitsCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir, data := t.TempDir(), t.TempDir()
	startFile := filepath.Join(dir, "start.yaml")
	writeYAML(t, startFile, "defaults:\n  max_series: 100\ntenants:\n  acme:\n    max_series: 5\n")
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, data, addrs, "--limits-file", startFile, "--limits-reload-period", "100ms")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	a := p.grpc

	waitVersion(t, bin, a, func(v uint64) bool { return v == 1 })
	if out := mustCLI(t, bin, "limits", "get", "--addr", a); !strings.Contains(out, "acme:\n    max_series: 5") {
		t.Fatalf("the limits file was not proposed as version 1:\n%s", out)
	}

	out := mustCLI(t, bin, "limits", "set", "--addr", a, "--tenant", "acme", "max_series=7", "ingestion_rate=50", "sample_rates.locate=25")
	if !strings.Contains(out, "version 2") {
		t.Fatalf("set: %s", out)
	}
	out = mustCLI(t, bin, "limits", "get", "--addr", a, "--tenant", "acme")
	for _, want := range []string{"version: 2", "max_series: 7", "ingestion_rate: 50", "locate: 25", "effective for acme: max_series=7"} {
		if !strings.Contains(out, want) {
			t.Fatalf("get --tenant lacks %q:\n%s", want, out)
		}
	}

	// Bad values: refused, the field named, nothing applied.
	bad := filepath.Join(dir, "bad.yaml")
	writeYAML(t, bad, "defaults:\n  max_series: 200\ntenants:\n  acme:\n    ingestion_rate: -1\n")
	out, err := runCLI(t, bin, "limits", "apply", "--addr", a, "-f", bad)
	if err == nil || !strings.Contains(out, "tenants.acme.ingestion_rate") || !strings.Contains(out, "line 5") {
		t.Fatalf("bad file: err=%v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "limits", "set", "--addr", a, "--tenant", "acme", "max_series=9", "ingestion_burst=-3")
	if err == nil || !strings.Contains(out, "tenants.acme.ingestion_burst") {
		t.Fatalf("bad set: err=%v\n%s", err, out)
	}
	out, err = runCLI(t, bin, "limits", "set", "--addr", a, "--global", "backlog_controller.kp=1")
	if err == nil || !strings.Contains(out, "global.backlog_controller.kind") {
		t.Fatalf("partial controller: err=%v\n%s", err, out)
	}
	if v := configVersion(t, bin, a); v != 2 {
		t.Fatalf("a refused change moved the version to %d", v)
	}
	if out := mustCLI(t, bin, "limits", "get", "--addr", a); !strings.Contains(out, "max_series: 7") || strings.Contains(out, "200") {
		t.Fatalf("a refused change altered the config:\n%s", out)
	}

	// diff, then apply: the whole file replaces the document.
	good := filepath.Join(dir, "good.yaml")
	writeYAML(t, good, "defaults:\n  max_series: 100\ntenants:\n  acme:\n    max_series: 9\n  beta:\n    ingestion_rate: 10\nglobal:\n  sample_rates:\n    locate: 50\n")
	out = mustCLI(t, bin, "limits", "diff", "--addr", a, "-f", good)
	for _, want := range []string{"~ tenants.acme.max_series: 7 → 9", "- tenants.acme.ingestion_rate: 50", "+ tenants.beta.ingestion_rate: 10", "+ global.sample_rates.locate: 50"} {
		if !strings.Contains(out, want) {
			t.Fatalf("diff lacks %q:\n%s", want, out)
		}
	}
	if out := mustCLI(t, bin, "limits", "apply", "--addr", a, "-f", good); !strings.Contains(out, "version 3") {
		t.Fatalf("apply: %s", out)
	}
	if out := mustCLI(t, bin, "limits", "diff", "--addr", a, "-f", good); !strings.Contains(out, "no changes") {
		t.Fatalf("diff after apply:\n%s", out)
	}
	// A file written from version 2 is stale now: compare-and-set refuses it.
	stale := filepath.Join(dir, "stale.yaml")
	writeYAML(t, stale, "version: 2\ndefaults:\n  max_series: 1\n")
	out, err = runCLI(t, bin, "limits", "apply", "--addr", a, "-f", stale)
	if err == nil || !strings.Contains(out, "not 2") {
		t.Fatalf("stale apply: err=%v\n%s", err, out)
	}
	if out := mustCLI(t, bin, "status", "--addr", a); !strings.Contains(out, "runtime config: version 3") {
		t.Fatalf("status:\n%s", out)
	}

	// Snapshot at version 3, change, restore: the restored document comes
	// back under a version above every earlier one.
	backup := filepath.Join(dir, "backup.tgb")
	mustCLI(t, bin, "snapshot", "save", "--addr", a, "-o", backup)
	mustCLI(t, bin, "limits", "set", "--addr", a, "--tenant", "acme", "max_series=11")
	mustCLI(t, bin, "snapshot", "restore", "--force", "--addr", a, backup)
	v := waitVersion(t, bin, a, func(v uint64) bool { return v > 4 })
	if out := mustCLI(t, bin, "limits", "diff", "--addr", a, "-f", good); !strings.Contains(out, "no changes") {
		t.Fatalf("config after restore (version %d) is not the saved one:\n%s", v, out)
	}

	// Restart with the same (unchanged) file: the node does not propose it
	// again; the replicated config stays the truth.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	p = startDev(t, bin, data, addrs, "--limits-file", startFile, "--limits-reload-period", "100ms")
	time.Sleep(time.Second) // several proposer rounds (100ms): the file must not come back
	if got := configVersion(t, bin, a); got != v {
		t.Fatalf("after a restart with the same file the version is %d, want %d", got, v)
	}
	// Editing the file proposes it.
	writeYAML(t, startFile, "defaults:\n  max_series: 300\n")
	waitVersion(t, bin, a, func(got uint64) bool { return got > v })
	if out := mustCLI(t, bin, "limits", "get", "--addr", a); !strings.Contains(out, "max_series: 300") || strings.Contains(out, "acme") {
		t.Fatalf("edited file not proposed:\n%s", out)
	}

	// limits get --global: only the global part, and the backlog controller's
	// state from the config owner (here: off, then running for a kind that
	// starts with a digit, which the controller once refused though the
	// config took it, then for another kind).
	if out := mustCLI(t, bin, "limits", "get", "--global", "--addr", a); strings.Contains(out, "max_series") || !strings.Contains(out, "# backlog controller: off") {
		t.Fatalf("get --global without a controller:\n%s", out)
	}
	mustCLI(t, bin, "limits", "set", "--addr", a, "--global", "backlog_controller.kind=9locate", "backlog_controller.target=1000",
		"backlog_controller.period=10s", "backlog_controller.kp=0.5")
	if out := mustCLI(t, bin, "limits", "get", "--global", "--addr", a); strings.Contains(out, "DISABLED") || !strings.Contains(out, "backlog controller (9locate) on ") {
		t.Fatalf("get --global with a controller of kind 9locate (the config's kinds are the controller's):\n%s", out)
	}
	mustCLI(t, bin, "limits", "set", "--addr", a, "--global", "backlog_controller.kind=locate")
	deadline := time.Now().Add(20 * time.Second) // generous: only catches hangs
	for {
		out := mustCLI(t, bin, "limits", "get", "--global", "--addr", a)
		if strings.Contains(out, "backlog controller (locate) on ") && strings.Contains(out, "enabled; output 100%") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller not enabled:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
