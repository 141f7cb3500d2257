package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitsApplyEnvoyCLI: an envoyproxy/ratelimit file goes into the
// replicated config with `limits apply-envoy`, shows in `limits get` (whose
// output `limits apply -f` takes back unchanged), a bad file is refused
// naming the field and line with nothing applied, and --delete removes the
// domain.
func TestLimitsApplyEnvoyCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	dir, data := t.TempDir(), t.TempDir()
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	p := startDev(t, bin, data, addrs)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	a := p.grpc

	mustCLI(t, bin, "limits", "set", "--addr", a, "--tenant", "acme", "max_series=7")
	good := filepath.Join(dir, "edge.yaml")
	writeYAML(t, good, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n  - key: path\n    value: /login\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	out := mustCLI(t, bin, "limits", "apply-envoy", "--addr", a, "-f", good)
	for _, want := range []string{"+ envoy.edge.remote_address: 10/second", "+ envoy.edge.path_/login: 5/minute shadow_mode", "version 2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("apply-envoy lacks %q:\n%s", want, out)
		}
	}
	got := mustCLI(t, bin, "limits", "get", "--addr", a)
	for _, want := range []string{"acme:\n    max_series: 7", "envoy:\n  - domain: \"edge\"", "requests_per_unit: 10"} {
		if !strings.Contains(got, want) {
			t.Fatalf("get lacks %q:\n%s", want, got)
		}
	}
	// get → apply -f is a no-op: the Envoy section round-trips.
	whole := filepath.Join(dir, "whole.yaml")
	writeYAML(t, whole, got)
	out = mustCLI(t, bin, "limits", "apply", "--addr", a, "-f", whole)
	if v := configVersion(t, bin, a); v != 2 {
		t.Fatalf("re-applying get's output changed the config to version %d:\n%s", v, out)
	}

	bad := filepath.Join(dir, "bad.yaml")
	writeYAML(t, bad, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 10\n")
	out, err := runCLI(t, bin, "limits", "apply-envoy", "--addr", a, "-f", bad)
	if err == nil || !strings.Contains(out, "descriptors[0].rate_limit.unit") || !strings.Contains(out, "line 5") {
		t.Fatalf("bad file: err=%v\n%s", err, out)
	}
	if v := configVersion(t, bin, a); v != 2 {
		t.Fatalf("a refused file moved the version to %d", v)
	}

	out = mustCLI(t, bin, "limits", "apply-envoy", "--addr", a, "--delete", "edge")
	if !strings.Contains(out, "- envoy.edge.remote_address") {
		t.Fatalf("delete: %s", out)
	}
	if got := mustCLI(t, bin, "limits", "get", "--addr", a); strings.Contains(got, "envoy:") || !strings.Contains(got, "max_series: 7") {
		t.Fatalf("after delete:\n%s", got)
	}
}
