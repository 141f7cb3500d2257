package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node of a new cluster waiting for its --bootstrap-expect members names
// them; one with no state and no way to form a cluster says it waits to be
// added.
func TestWaitingForNamesWhatIsMissing(t *testing.T) {
	s := startUnready(t, func(c *Config) { c.Cluster.BootstrapExpect = 2 })
	want := "waiting for --bootstrap-expect 2: 1 alive (n1)"
	// The member list fills in as serf starts; wait for it (hang guard only).
	for deadline := time.Now().Add(30 * time.Second); s.WaitingFor() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("WaitingFor = %q, want %q", s.WaitingFor(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.Ready() {
		t.Fatal("ready without a cluster")
	}

	s2 := startUnready(t, func(c *Config) { c.Gossip.Join = []string{"127.0.0.1:1"} })
	if got := s2.WaitingFor(); !strings.Contains(got, "waiting to be added to a cluster") || !strings.Contains(got, "--join 127.0.0.1:1") {
		t.Fatalf("WaitingFor = %q", got)
	}
}

// startUnready starts a gossiping node without waiting for it to be ready.
func startUnready(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{
		Node:   NodeConfig{ID: "n1", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Raft:   RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Gossip: GossipConfig{Addr: "127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	mod(&cfg)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})
	return s
}

// EffectiveLimits on a running node reports the file's default (which wins over
// DefaultMaxSeries) and its overrides, for the banner.
func TestLimitsInEffect(t *testing.T) {
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("defaults:\n  max_series: 500\ntenants:\n  a:\n    max_series: 9\n  b:\n    unlimited: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Limits.File = file; c.Limits.Reload = time.Minute })
	if s.WaitingFor() != "" {
		t.Fatalf("ready server waits for %q", s.WaitingFor())
	}
	// The node proposes its file as the runtime config (version 1); from then
	// on the replicated copy is what is in force, with the same values.
	deadline := time.Now().Add(10 * time.Second)
	for s.EffectiveLimits().ConfigVersion == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := s.EffectiveLimits(), (LimitsInfo{DefaultMaxSeries: 500, DefaultFrom: "runtime config", File: file, Overrides: 2, ConfigVersion: 1}); got != want {
		t.Fatalf("EffectiveLimits = %+v, want %+v", got, want)
	}
	s2, _ := startServer(t, t.TempDir(), func(c *Config) { c.Tracking.DefaultMaxSeries = 0 })
	if got, want := s2.EffectiveLimits(), (LimitsInfo{DefaultMaxSeries: 0, DefaultFrom: "flag"}); got != want {
		t.Fatalf("no file: %+v, want %+v", got, want)
	}
}
