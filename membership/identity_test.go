package membership

import (
	"strings"
	"testing"
	"time"
)

func startIdent(t *testing.T, id, cluster, inc string) *Membership {
	t.Helper()
	m, err := New(Config{NodeID: id, Zone: "z", GRPCAddr: id + ":1", RaftAddr: "127.0.0.1:2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, Incarnation: inc, ClusterID: cluster})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

// TestJoinOtherClusterRefused: a node of one cluster cannot join a node of
// another (different cluster ids); the error says so. A node that does not
// know its cluster yet joins, sees the cluster id and the members'
// incarnations, and its raft address names its incarnation.
func TestJoinOtherClusterRefused(t *testing.T) {
	a := startIdent(t, "a", "00000000000000c1", "00000000000000a1")
	b := startIdent(t, "b", "00000000000000c2", "00000000000000b1")
	_, err := b.Join([]string{a.GossipAddr()})
	if err == nil || !strings.Contains(err.Error(), ErrOtherCluster.Error()) || !strings.Contains(err.Error(), "00000000000000c1") {
		t.Fatalf("join across clusters: err = %v, want one naming the other cluster", err)
	}
	if len(a.Members()) != 1 || len(b.Members()) != 1 {
		t.Fatalf("members after a refused join: a %v, b %v", a.Members(), b.Members())
	}

	c := startIdent(t, "c", "", "00000000000000c3")
	if _, err := c.Join([]string{a.GossipAddr()}); err != nil {
		t.Fatalf("join of a node without a cluster id: %v", err)
	}
	waitFor(t, "c to see a", func() bool { return len(c.Members()) == 2 })
	for _, m := range c.Members() {
		if m.ID == "a" && (m.ClusterID != "00000000000000c1" || m.Incarnation != "00000000000000a1" || m.RaftAddr != "127.0.0.1:2#00000000000000a1") {
			t.Fatalf("a as c sees it: %+v", m)
		}
	}
	if err := c.SetClusterID("00000000000000c1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to see c's cluster id", func() bool {
		for _, m := range a.Members() {
			if m.ID == "c" && m.ClusterID == "00000000000000c1" {
				return true
			}
		}
		return false
	})
}
