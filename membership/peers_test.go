package membership

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRestartRejoinsRecordedPeers: a node started without seeds, whose
// members joined it, is stopped without leaving and started again on its data
// dir. The members it recorded are what it joins, and after that join it
// sees both of them alive: the path a cluster's first node (no --join) takes
// after a SIGKILL, when serf's buffered snapshot may lack the last members.
func TestRestartRejoinsRecordedPeers(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeID: "a", Zone: "z1", GRPCAddr: "a:1", RaftAddr: "a:2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, DataDir: dir}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.SavedPeers(); len(got) != 0 {
		t.Fatalf("fresh data dir: saved peers %v, want none", got)
	}
	b := start(t, "b", "z2")
	c, err := New(Config{NodeID: "c", Zone: "z3", GRPCAddr: "c:1", RaftAddr: "c:2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, DataDir: t.TempDir(), ClusterVersion: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown() })
	for _, m := range []*Membership{b, c} {
		if _, err := m.Join([]string{a.GossipAddr()}); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{b.GossipAddr(), c.GossipAddr()}
	waitFor(t, "a records b and c", func() bool {
		got, err := readPeers(dir)
		if err != nil {
			t.Fatal(err)
		}
		var addrs []string
		for _, p := range got {
			addrs = append(addrs, p.Addr)
		}
		return slices.Equal(addrs, want)
	})
	addr := a.GossipAddr()
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// Serf's snapshot is what a restart would use alone; take it away so
	// that this test checks the record, whatever serf happened to flush.
	if err := os.Remove(filepath.Join(dir, "serf.snapshot")); err != nil {
		t.Fatal(err)
	}

	cfg.BindAddr = addr
	a2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a2.Shutdown() })
	if got := a2.SavedPeers(); !slices.Equal(got, want) {
		t.Fatalf("restarted: saved peers %v, want %v", got, want)
	}
	// Before gossip lists anyone, the record holds each member's version.
	if b, c, x := a2.RecordedVersion("b"), a2.RecordedVersion("c"), a2.RecordedVersion("x"); b != 1 || c != 3 || x != 0 {
		t.Fatalf("recorded versions b=%d c=%d x=%d, want 1, 3 and 0 (not recorded)", b, c, x)
	}
	if _, err := a2.Join(a2.SavedPeers()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restarted node sees b and c alive", func() bool {
		return countStatus(a2.Members(), StatusAlive) == 3
	})
}

// TestRecordedPeersCorrupt: a record that cannot be read is reported by
// readPeers and ignored by New (the node starts, rejoining nobody), and the
// next membership change rewrites it.
func TestRecordedPeersCorrupt(t *testing.T) {
	for name, body := range map[string]string{
		"not json":    "{\"version\":1,\"peers\":[",
		"version":     `{"version":2,"peers":[]}`,
		"bad address": `{"version":1,"peers":[{"name":"b","addr":"nowhere"}]}`,
		"no name":     `{"version":1,"peers":[{"name":"","addr":"127.0.0.1:1"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, peersFileName)
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := readPeers(dir); err == nil || !strings.Contains(err.Error(), peersFileName) {
				t.Fatalf("readPeers: err %v, want one naming %s", err, peersFileName)
			}
			a, err := New(Config{NodeID: "a", Zone: "z1", GRPCAddr: "a:1", RaftAddr: "a:2", BindAddr: "127.0.0.1:0",
				ProbeInterval: 200 * time.Millisecond, DataDir: dir})
			if err != nil {
				t.Fatalf("New with a corrupt record: %v", err)
			}
			defer func() { _ = a.Shutdown() }()
			if got := a.SavedPeers(); len(got) != 0 {
				t.Fatalf("saved peers %v from a corrupt record", got)
			}
			b := start(t, "b", "z2")
			if _, err := b.Join([]string{a.GossipAddr()}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the record is rewritten", func() bool {
				got, err := readPeers(dir)
				return err == nil && len(got) == 1 && got[0].Name == "b"
			})
		})
	}
}
