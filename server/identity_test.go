package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
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
	still := func(c *Config) { c.Clock = clk.Now }
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

func TestPlanIncarnation(t *testing.T) {
	const a, b, cid = "00000000000000a1", "00000000000000b1", "00000000000000c1"
	m := membership.Member{ID: "n3", Zone: "z3", RaftAddr: "h:1#" + b, Incarnation: b, ClusterID: cid, Status: membership.StatusAlive}
	voter := func(addr string) raft.Server {
		return raft.Server{Suffrage: raft.Voter, ID: "n3", Address: raft.ServerAddress(addr)}
	}
	nonvoter := func(addr string) raft.Server {
		return raft.Server{Suffrage: raft.Nonvoter, ID: "n3", Address: raft.ServerAddress(addr)}
	}
	adopted := m
	adopted.IncarnationAdopted = true
	old := m
	old.Incarnation, old.RaftAddr, old.ClusterID = "", "h:1", ""
	other := m
	other.ClusterID = "00000000000000c2"
	for _, tc := range []struct {
		name     string
		srv      raft.Server
		m        membership.Member
		voters   int
		zoneHas  bool
		want     incarnationAction
		wantSame bool
	}{
		{"same incarnation", voter("h:1#" + b), m, 3, true, incarnationKeep, true},
		{"earlier incarnation", voter("h:1#" + a), m, 3, true, incarnationReplace, false},
		{"earlier incarnation, new address", voter("h:2#" + a), m, 3, true, incarnationReplace, false},
		{"plain address, wiped", voter("h:1"), m, 3, true, incarnationReplace, false},
		{"plain address, adopted", voter("h:1"), adopted, 3, true, incarnationKeep, true},
		{"earlier build member", voter("h:1"), old, 3, true, incarnationKeep, true},
		{"other cluster (never added)", voter("h:1#" + a), other, 3, true, incarnationKeep, false},
		{"caught-up non-voter, zone without voter", nonvoter("h:1#" + b), m, 2, false, incarnationPromote, true},
		{"non-voter, group full", nonvoter("h:1#" + b), m, 3, true, incarnationKeep, true},
	} {
		got := planIncarnation(tc.srv, tc.m, cid, tc.voters, 3, tc.zoneHas)
		if got != tc.want {
			t.Errorf("%s: action %d, want %d", tc.name, got, tc.want)
		}
		if same := sameIncarnation(tc.srv, tc.m); same != tc.wantSame {
			t.Errorf("%s: sameIncarnation %v, want %v", tc.name, same, tc.wantSame)
		}
	}
}

func TestBootstrapClusterID(t *testing.T) {
	ms := []membership.Member{
		{ID: "n1", Incarnation: "00000000000000a1", Status: membership.StatusAlive},
		{ID: "n2", Incarnation: "00000000000000a2", Status: membership.StatusAlive},
		{ID: "n3", Incarnation: "00000000000000a3", Status: membership.StatusAlive},
	}
	id := bootstrapClusterID(ms)
	if raftnode.ValidID(id) != nil {
		t.Fatalf("cluster id %q", id)
	}
	if bootstrapClusterID([]membership.Member{ms[2], ms[0], ms[1]}) != id {
		t.Fatal("cluster id depends on the members' order")
	}
	wiped := append([]membership.Member(nil), ms...)
	wiped[2].Incarnation = "00000000000000b3"
	if bootstrapClusterID(wiped) == id {
		t.Fatal("a new incarnation forms the same cluster id")
	}
	// The wiped n3 meets n1 and n2 of the cluster they formed: it must not bootstrap.
	formed := []membership.Member{ms[0], ms[1], wiped[2]}
	formed[0].ClusterID, formed[1].ClusterID = id, id
	if ok, why := clusterExists("n3", formed, bootstrapClusterID(formed)); !ok || !strings.Contains(why, id) {
		t.Fatalf("wiped node: exists=%v %q", ok, why)
	}
	// Members forming the same cluster concurrently do bootstrap.
	if ok, why := clusterExists("n3", []membership.Member{ms[0], ms[1], ms[2]}, id); ok {
		t.Fatalf("new cluster seen as existing: %s", why)
	}
	legacy := []membership.Member{ms[0], ms[1]}
	legacy[0].IncarnationAdopted = true
	if ok, _ := clusterExists("n2", legacy, "x"); !ok {
		t.Fatal("a member on an earlier build's data dir does not show an existing cluster")
	}
}

// TestJoinAnotherClusterRefused: a node of one cluster started with --join
// pointing at a node of another is refused at the join, and says so in its
// readiness; the other cluster never lists it.
func TestJoinAnotherClusterRefused(t *testing.T) {
	gossip := func(c *Config) { c.GossipAddr = "127.0.0.1:0" }
	a, _ := startServer(t, filepath.Join(t.TempDir(), "a"), func(c *Config) { gossip(c); c.NodeID = "a" })
	defer stop(t, a)
	b, _ := startServer(t, filepath.Join(t.TempDir(), "b"), func(c *Config) { gossip(c); c.NodeID = "b" })
	stop(t, b) // b now belongs to its own cluster (--dev)

	cfg := Config{NodeID: "b", DataDir: b.cfg.DataDir, Bootstrap: true, GossipAddr: "127.0.0.1:0", Join: []string{a.GossipAddr()},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", RaftAddr: "127.0.0.1:0", Logger: b.cfg.Logger}
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
