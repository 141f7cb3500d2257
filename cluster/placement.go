package cluster

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

// PlaceAll decides the voters of every group at once, so that the replicas
// spread evenly over the nodes of each zone and not only on average.
//
// Placement alone ranks members per group independently: with 4 groups and
// two nodes in a zone, one node wins all four about once in eight clusters.
// PlaceAll keeps Placement's choice of how many voters each zone gets per
// group, then fills every zone's slots group by group (ascending) with the
// best-scored member of that zone whose load is still below its fair share:
// every member of a zone ends with ⌊D/n⌋ or ⌈D/n⌉ of the zone's D slots
// (n members), and the surplus ⌈⌉ loads go to the members that win first.
// The result depends only on the candidates (ids, zones) and the counts, so
// every leader computes the same placement for every group.
func PlaceAll(groups int, candidates []membership.Member, replicas int) [][]membership.Member {
	out := make([][]membership.Member, groups)
	if len(candidates) == 0 {
		return out
	}
	zoneMembers := map[string][]membership.Member{}
	for _, m := range candidates {
		zoneMembers[m.Zone] = append(zoneMembers[m.Zone], m)
	}
	// Slots per zone per group, from Placement's zone choice.
	slots := make([]map[string]int, groups)
	demand := map[string]int{}
	var zoneOrder []string
	for g := range groups {
		slots[g] = map[string]int{}
		for _, m := range Placement(g, candidates, replicas) {
			if _, seen := demand[m.Zone]; !seen {
				zoneOrder = append(zoneOrder, m.Zone)
			}
			slots[g][m.Zone]++
			demand[m.Zone]++
		}
	}
	slices.Sort(zoneOrder)
	picked := make([]map[string][]membership.Member, groups)
	for g := range picked {
		picked[g] = map[string][]membership.Member{}
	}
	for _, z := range zoneOrder {
		ms := zoneMembers[z]
		n := len(ms)
		floor, extra := demand[z]/n, demand[z]%n // extra members may hold floor+1
		load := map[string]int{}
		full := 0 // members holding floor+1
		for g := range groups {
			k := slots[g][z]
			if k == 0 {
				continue
			}
			ranked := slices.Clone(ms)
			slices.SortFunc(ranked, func(a, b membership.Member) int {
				sa, sb := placementScore(g, a.ID), placementScore(g, b.ID)
				if sa != sb {
					if sa > sb {
						return -1
					}
					return 1
				}
				return strings.Compare(a.ID, b.ID)
			})
			var chosen []membership.Member
			for _, m := range ranked {
				if len(chosen) == k {
					break
				}
				l := load[m.ID]
				if l < floor || (l == floor && full < extra) {
					chosen = append(chosen, m)
				}
			}
			// Only when k > 1 voters must come from one zone can the fair
			// shares leave too few distinct members; then the best-scored
			// remaining ones take the slots over their share.
			for _, m := range ranked {
				if len(chosen) == k {
					break
				}
				if !slices.ContainsFunc(chosen, func(c membership.Member) bool { return c.ID == m.ID }) {
					chosen = append(chosen, m)
				}
			}
			for _, m := range chosen {
				if load[m.ID] == floor {
					full++
				}
				load[m.ID]++
			}
			picked[g][z] = chosen
		}
	}
	for g := range groups {
		// Voters in Placement's order of zones (best zone first), so the
		// first voter of a group stays its best-scored zone's choice.
		for _, m := range Placement(g, candidates, replicas) {
			zs := picked[g][m.Zone]
			if len(zs) > 0 {
				out[g] = append(out[g], zs[0])
				picked[g][m.Zone] = zs[1:]
			}
		}
	}
	return out
}
