package cluster

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

func TestRaiseVoters(t *testing.T) {
	var ms []membership.Member
	for z := range 3 {
		for n := range 2 {
			id := fmt.Sprintf("n%d-%d", z, n)
			ms = append(ms, membership.Member{ID: id, Zone: fmt.Sprintf("zone-%d", z), RaftAddr: id + ":7000", Status: membership.StatusAlive})
		}
	}
	// One node is down and one is draining: neither is chosen.
	ms[1].Status = membership.StatusFailed
	ms[2].Decommissioning = true

	got := RaiseVoters(4, 8, ms, 3, raft.Configuration{})
	if len(got) != 4 {
		t.Fatalf("%d group configs for groups 4..7", len(got))
	}
	for i, servers := range got {
		gc := GroupConfig{Group: 4 + i, Servers: servers}
		zones := map[string]bool{}
		for _, s := range gc.Servers {
			id := string(s.ID)
			if id == ms[1].ID || id == ms[2].ID {
				t.Fatalf("group %d: voter %s is down or draining", gc.Group, id)
			}
			if string(s.Address) != id+":7000" {
				t.Fatalf("group %d: voter %s at %s", gc.Group, id, s.Address)
			}
			zones[id[:2]] = true
		}
		if len(gc.Servers) != 3 || len(zones) != 3 {
			t.Fatalf("group %d: voters %v, want one per zone", gc.Group, gc.Servers)
		}
	}
	// Every node computes the same configurations whatever order serf lists
	// the members in.
	rev := slices.Clone(ms)
	slices.Reverse(rev)
	again := RaiseVoters(4, 8, rev, 3, raft.Configuration{})
	for i := range got {
		if !slices.Equal(got[i], again[i]) {
			t.Fatalf("group %d: %v vs %v for a reordered member list", 4+i, got[i], again[i])
		}
	}
	if RaiseVoters(8, 8, ms, 3, raft.Configuration{}) != nil || RaiseVoters(4, 8, nil, 3, raft.Configuration{}) != nil {
		t.Fatal("nothing to place must give nil")
	}
	// A single dev node places every new group on itself.
	dev := []membership.Member{{ID: "n1", RaftAddr: "127.0.0.1:1", Status: membership.StatusAlive}}
	for i, servers := range RaiseVoters(1, 3, dev, 3, raft.Configuration{}) {
		if len(servers) != 1 || servers[0].ID != "n1" {
			t.Fatalf("dev group %d: %v", 1+i, servers)
		}
	}
	// Only group 0's voters apply the raise and bootstrap: with group 0 on
	// n0-0, n1-1 and n2-1 (and n2-0 its non-voter), every new group gets
	// exactly those three.
	order := raft.Configuration{Servers: []raft.Server{
		{Suffrage: raft.Voter, ID: "n0-0"}, {Suffrage: raft.Voter, ID: "n1-1"},
		{Suffrage: raft.Voter, ID: "n2-1"}, {Suffrage: raft.Nonvoter, ID: "n2-0"},
	}}
	for i, servers := range RaiseVoters(4, 8, ms, 3, order) {
		var ids []string
		for _, s := range servers {
			ids = append(ids, string(s.ID))
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"n0-0", "n1-1", "n2-1"}) {
			t.Fatalf("group %d: voters %v, want group 0's", 4+i, ids)
		}
	}
}
