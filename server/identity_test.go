package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/nodeid"
)

// TestIdentityAdoptedOnUpgrade: a data dir written by an earlier build (state,
// no identity.json) gets an identity on first start, keeps every series
// without a resync, and accepts the plain raft address that build's
// configurations hold.
func TestIdentityAdoptedOnUpgrade(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	// A still wall clock: no expiry entry lands between the state images
	// compared across the restart.
	clk := newTestClock()
	still := func(c *Config) { c.Clock.Now = clk.Now }
	s, c := startServer(t, dir, still)
	hs := hashesIn(3, 7, 12)
	if rej := track(t, c, "t1", 7, hs); len(rej) != 0 {
		t.Fatalf("rejected %d", len(rej))
	}
	first := s.ident.Incarnation
	if s.ident.Adopted || s.ident.ClusterID() == "" || !strings.HasSuffix(s.RaftAddr(), "#"+first) {
		t.Fatalf("dev node identity: %+v, raft address %s", s.ident, s.RaftAddr())
	}
	g := 7 * 4 / 64
	before := snapshotOf(t, s, g)
	stop(t, s)
	if err := os.Remove(filepath.Join(dir, nodeid.File)); err != nil {
		t.Fatal(err)
	}

	s, c = startServer(t, dir, still)
	defer stop(t, s)
	if !s.ident.Adopted || s.ident.Incarnation == first {
		t.Fatalf("identity after upgrade: %+v (first incarnation %s)", s.ident, first)
	}
	if got := snapshotOf(t, s, g); string(got) != string(before) {
		t.Fatalf("group %d: state after the upgrade start differs from before", g)
	}
	if rej := track(t, c, "t1", 7, hs); len(rej) != 0 {
		t.Fatalf("after the upgrade %d accepted series rejected", len(rej))
	}
	if _, err := os.Stat(filepath.Join(dir, nodeid.File)); err != nil {
		t.Fatalf("identity not written: %v", err)
	}
}

// TestJoinAnotherClusterRefused: a node of one cluster started with --join
// pointing at a node of another is refused at the join, and says so in its
// readiness; the other cluster never lists it.
func TestJoinAnotherClusterRefused(t *testing.T) {
	gossip := func(c *Config) { c.Gossip.Addr = "127.0.0.1:0" }
	a, _ := startServer(t, filepath.Join(t.TempDir(), "a"), func(c *Config) { gossip(c); c.Node.ID = "a" })
	defer stop(t, a)
	b, _ := startServer(t, filepath.Join(t.TempDir(), "b"), func(c *Config) { gossip(c); c.Node.ID = "b" })
	stop(t, b) // b now belongs to its own cluster (--dev)

	cfg := Config{
		Node:    NodeConfig{ID: "b", DataDir: b.cfg.Node.DataDir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Cluster: ClusterConfig{Bootstrap: true},
		Gossip:  GossipConfig{Addr: "127.0.0.1:0", Join: []string{a.GossipAddr()}},
		Raft:    RaftConfig{Addr: "127.0.0.1:0"},
		Logger:  b.cfg.Logger,
	}
	b2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, b2)
	waitFor(t, "b's join to be refused", func() bool {
		return strings.Contains(b2.NotReadyReason(), "belongs to another cluster")
	})
	why := b2.NotReadyReason()
	if !strings.Contains(why, a.ident.ClusterID()) || !strings.Contains(why, b2.ident.ClusterID()) {
		t.Fatalf("refusal does not name both clusters (%s, %s): %s", a.ident.ClusterID(), b2.ident.ClusterID(), why)
	}
	for _, m := range a.memberList() {
		if m.ID == "b" {
			t.Fatalf("a lists b after a refused join: %+v", m)
		}
	}
}
