package cluster

import (
	"fmt"
	"testing"

	"github.com/tollgate-io/tollgate/membership"
)

func TestPlacementOneVoterPerZone(t *testing.T) {
	var ms []membership.Member
	for z := 0; z < 3; z++ {
		for n := 0; n < 4; n++ {
			ms = append(ms, membership.Member{ID: fmt.Sprintf("n%d-%d", z, n), Zone: fmt.Sprintf("zone-%d", z)})
		}
	}
	load := map[string]int{}
	for g := 0; g < 240; g++ {
		vs := Placement(g, ms, 3)
		if len(vs) != 3 {
			t.Fatalf("group %d: %d voters", g, len(vs))
		}
		zones := map[string]bool{}
		for _, v := range vs {
			zones[v.Zone] = true
			load[v.ID]++
		}
		if len(zones) != 3 {
			t.Fatalf("group %d: voters %v not one per zone", g, vs)
		}
		// Deterministic regardless of input order.
		rev := append([]membership.Member(nil), ms...)
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		vs2 := Placement(g, rev, 3)
		for i := range vs {
			if vs[i].ID != vs2[i].ID {
				t.Fatalf("group %d: placement depends on member order", g)
			}
		}
	}
	// 240 groups over 4 nodes per zone: 60 each on average; rendezvous hashing
	// keeps every node well within [30, 90].
	for id, n := range load {
		if n < 30 || n > 90 {
			t.Errorf("node %s holds %d of 240 groups", id, n)
		}
	}
}

func TestPlacementFewZones(t *testing.T) {
	ms := []membership.Member{{ID: "a", Zone: "z"}, {ID: "b", Zone: "z"}, {ID: "c", Zone: "z"}, {ID: "d", Zone: "z"}}
	if vs := Placement(0, ms, 3); len(vs) != 3 {
		t.Fatalf("single zone: %d voters, want 3", len(vs))
	}
	if vs := Placement(0, ms[:2], 3); len(vs) != 2 {
		t.Fatalf("two nodes: %d voters, want 2", len(vs))
	}
	five := []membership.Member{{ID: "a", Zone: "1"}, {ID: "b", Zone: "2"}, {ID: "c", Zone: "3"}, {ID: "d", Zone: "4"}, {ID: "e", Zone: "5"}}
	if vs := Placement(0, five, 3); len(vs) != 5 {
		t.Fatalf("five zones: %d voters, want one per zone (5)", len(vs))
	}
}
