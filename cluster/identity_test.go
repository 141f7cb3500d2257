package cluster

import (
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

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
