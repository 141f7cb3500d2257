package main

import (
	"regexp"
	"strings"
	"testing"
)

// status --tenant on a dev node: after a random fill past the limit, the
// tenant's shares sum to max_series, the series to the limit, and headroom
// moved (movable: the node runs without --share-mode, so this also checks
// that movable is the binary's default); with --share-mode static the fixed
// split is shown and nothing moves; an unknown tenant and a bad --share-mode
// are clear errors.
func TestStatusTenantShowsShares(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	for _, mode := range []string{"movable", "static"} {
		addrs := [3]string{freePort(t), freePort(t), freePort(t)}
		args := []string{"--default-max-series", "100"}
		if mode == "static" {
			args = append(args, "--share-mode", mode)
		}
		p := startDev(t, bin, t.TempDir(), addrs, args...)
		out, err := runCLI(t, bin, "track", "--addr", p.grpc, "--tenant", "st", "--count", "300", "--json")
		if err != nil {
			t.Fatalf("%s: track: %v\n%s", mode, err, out)
		}
		out, err = runCLI(t, bin, "status", "--addr", p.grpc, "--tenant", "st")
		if err != nil {
			t.Fatalf("%s: status --tenant: %v\n%s", mode, err, out)
		}
		t.Logf("%s:\n%s", mode, out)
		if !strings.Contains(out, "tenant st: max_series 100, share mode "+mode) || !strings.Contains(out, "GROUP  SERIES  BASE  DELTA  SHARE") {
			t.Fatalf("%s: header missing:\n%s", mode, out)
		}
		total := regexp.MustCompile(`(?m)^total\s+(\d+)\s+(\d+)\s+([+-]\d+)\s+(\d+)`).FindStringSubmatch(out)
		if total == nil {
			t.Fatalf("%s: no total line:\n%s", mode, out)
		}
		series, base, delta, share := total[1], total[2], total[3], total[4]
		// 300 random series fill every group in both modes: the shares sum
		// to the limit and so do the series.
		if series != "100" || base != "100" || delta != "+0" || share != "100" {
			t.Fatalf("%s: total series %s base %s delta %s share %s; want 100 100 +0 100:\n%s", mode, series, base, delta, share, out)
		}
		moves := regexp.MustCompile(`(?m)^\d+\s+\d+\s+\d+\s+[+-]\d+\s+-?\d+\s+\d+\s+\d+\s+(\d+)`).FindAllStringSubmatch(out, -1)
		var anyMove bool
		for _, m := range moves {
			anyMove = anyMove || m[1] != "0"
		}
		// Whether headroom moved depends on the order the groups filled in
		// (one batch per group, decided concurrently): movable may or may
		// not show moves, static never does.
		if len(moves) != 4 || (mode == "static" && anyMove) {
			t.Fatalf("%s: %d group rows, moves seen %v:\n%s", mode, len(moves), anyMove, out)
		}
		out, err = runCLI(t, bin, "status", "--addr", p.grpc, "--tenant", "nobody-here")
		if err == nil || !strings.Contains(out, "NotFound") || !strings.Contains(out, `tenant "nobody-here" is unknown`) {
			t.Fatalf("%s: unknown tenant: err %v\n%s", mode, err, out)
		}
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	out, err := runCLI(t, bin, "server", "--dev", "--data-dir", t.TempDir(), "--share-mode", "floating")
	if err == nil || !strings.Contains(out, `share mode "floating": must be "movable" or "static"`) {
		t.Fatalf("bad --share-mode: err %v\n%s", err, out)
	}
}
