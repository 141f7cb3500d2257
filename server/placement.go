package server

import (
	"hash/fnv"
	"slices"
	"strings"

	"github.com/tollgate-io/tollgate/membership"
)

// Placement decides which members should be the voters of a group.
//
// Every member gets a score per group (rendezvous hashing of group and node id),
// so each group ranks the members independently and the groups spread evenly
// over the nodes of a zone; adding or removing a node only moves the groups it
// wins or held. The voters are the best-scored member of every zone (zones in
// the order of their best scores), then, if that gives fewer than replicas
// voters (fewer zones than replicas), the next best members regardless of zone.
// So with three zones every group has exactly one voter per zone, whatever the
// number of nodes per zone, and a single-zone cluster still gets three voters.
func Placement(group int, candidates []membership.Member, replicas int) []membership.Member {
	type scored struct {
		m     membership.Member
		score uint64
	}
	all := make([]scored, 0, len(candidates))
	for _, m := range candidates {
		all = append(all, scored{m, placementScore(group, m.ID)})
	}
	slices.SortFunc(all, func(a, b scored) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.m.ID, b.m.ID)
	})
	var out []membership.Member
	zones := map[string]bool{}
	taken := make([]bool, len(all))
	for i, s := range all {
		if !zones[s.m.Zone] {
			zones[s.m.Zone] = true
			taken[i] = true
			out = append(out, s.m)
		}
	}
	for i, s := range all {
		if len(out) >= replicas {
			break
		}
		if !taken[i] {
			out = append(out, s.m)
		}
	}
	return out
}

func placementScore(group int, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	x := h.Sum64() ^ (uint64(group)+1)*0x9e3779b97f4a7c15
	// splitmix64 finaliser: fnv's low-entropy output for similar ids ("node-1",
	// "node-2") would otherwise rank them the same way for every group.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
