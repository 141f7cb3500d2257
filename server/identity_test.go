package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/raftnode"
)

func TestIdentityFile(t *testing.T) {
	dir := t.TempDir()
	id, err := loadIdentity(dir, true, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if id.Adopted || id.ClusterID != "" || raftnode.ValidID(id.Incarnation) != nil {
		t.Fatalf("new identity: %+v", id)
	}
	if err := id.setClusterID("00000000000000c1"); err != nil {
		t.Fatal(err)
	}
	again, err := loadIdentity(dir, false, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if again.Incarnation != id.Incarnation || again.ClusterID != "00000000000000c1" || again.Adopted {
		t.Fatalf("reloaded identity %+v, want %+v", again, id)
	}
	if err := again.setClusterID("00000000000000c2"); err == nil {
		t.Fatal("a data dir moved to another cluster")
	}

	if _, err := loadIdentity(dir, false, "n2"); err == nil || !strings.Contains(err.Error(), `belongs to node "n1"`) {
		t.Fatalf("data dir of n1 started as n2: %v", err)
	}
	path := filepath.Join(dir, identityFile)
	for name, content := range map[string]string{
		"not json":         "{",
		"bad incarnation":  `{"version":1,"node_id":"n1","incarnation":"xyz"}`,
		"bad cluster id":   `{"version":1,"node_id":"n1","incarnation":"00000000000000a1","cluster_id":"0"}`,
		"unknown version":  `{"version":9,"node_id":"n1","incarnation":"00000000000000a1"}`,
		"zero incarnation": `{"version":1,"node_id":"n1","incarnation":"0000000000000000"}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadIdentity(dir, false, "n1"); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}

	// A data dir with state but no identity (an earlier build's) adopts one.
	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "cluster.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ad, err := loadIdentity(old, false, "n1")
	if err != nil || !ad.Adopted {
		t.Fatalf("earlier build's data dir: %+v, %v", ad, err)
	}
}

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
	if s.ident.Adopted || s.ident.clusterID() == "" || !strings.HasSuffix(s.RaftAddr(), "#"+first) {
		t.Fatalf("dev node identity: %+v, raft address %s", s.ident, s.RaftAddr())
	}
	g := 7 * 4 / 64
	before := snapshotOf(t, s, g)
	stop(t, s)
	if err := os.Remove(filepath.Join(dir, identityFile)); err != nil {
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
	if _, err := os.Stat(filepath.Join(dir, identityFile)); err != nil {
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
	if !strings.Contains(why, a.ident.clusterID()) || !strings.Contains(why, b2.ident.clusterID()) {
		t.Fatalf("refusal does not name both clusters (%s, %s): %s", a.ident.clusterID(), b2.ident.clusterID(), why)
	}
	for _, m := range a.memberList() {
		if m.ID == "b" {
			t.Fatalf("a lists b after a refused join: %+v", m)
		}
	}
}
