package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

func aliveM(id, zone string, led ...int) membership.Member {
	return membership.Member{ID: id, Zone: zone, RaftAddr: id + ":7301", Status: membership.StatusAlive, GroupsLed: led}
}

func failedM(id, zone string) membership.Member {
	return membership.Member{ID: id, Zone: zone, RaftAddr: id + ":7301", Status: membership.StatusFailed}
}

func voterS(id string) raft.Server {
	return raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7301")}
}

// withInc gives m an incarnation (gossiped, and named in its raft address).
func withInc(m membership.Member, inc string, adopted bool) membership.Member {
	m.Incarnation, m.IncarnationAdopted, m.RaftAddr = inc, adopted, m.RaftAddr+"#"+inc
	return m
}

func withIncS(s raft.Server, inc string) raft.Server {
	s.Address += raft.ServerAddress("#" + inc)
	return s
}

func ids(ss []raft.Server) []string {
	var out []string
	for _, s := range ss {
		out = append(out, string(s.ID))
	}
	slices.Sort(out)
	return out
}

func TestPlanBootstrap(t *testing.T) {
	threeZones := []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3")}
	for _, tc := range []struct {
		name     string
		self     string
		expect   int
		members  []membership.Member
		hasState []bool
		wait     bool
		ignored  []string
		groups   map[int][]string // group → voters, for the groups self bootstraps
	}{
		{name: "fewer alive than expected", self: "a", expect: 3,
			members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), failedM("c", "z3")}, hasState: make([]bool, 2), wait: true},
		{name: "three zones: every node bootstraps every group with all three", self: "b", expect: 3,
			members: threeZones, hasState: make([]bool, 3),
			groups: map[int][]string{0: {"a", "b", "c"}, 1: {"a", "b", "c"}, 2: {"a", "b", "c"}}},
		{name: "group with local state or led elsewhere is left alone", self: "a", expect: 3,
			members:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3", 2)},
			hasState: []bool{true, false, false},
			groups:   map[int][]string{1: {"a", "b", "c"}}},
		{name: "more alive than expected: the first by id, in any listing order", self: "a", expect: 3,
			members:  []membership.Member{aliveM("d", "z1"), aliveM("c", "z3"), aliveM("b", "z2"), aliveM("a", "z1")},
			hasState: make([]bool, 1), ignored: []string{"d"},
			groups: map[int][]string{0: {"a", "b", "c"}}},
		{name: "a node beyond expect bootstraps nothing", self: "d", expect: 3,
			members:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3"), aliveM("d", "z1")},
			hasState: make([]bool, 2), ignored: []string{"d"}, groups: map[int][]string{}},
		{name: "zone with no alive member: two voters", self: "a", expect: 2,
			members:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), failedM("c", "z3")},
			hasState: make([]bool, 1), groups: map[int][]string{0: {"a", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := planBootstrap(bootstrapInput{Self: tc.self, Expect: tc.expect, Replicas: 3, Members: tc.members, HasState: tc.hasState})
			if plan.Wait != tc.wait {
				t.Fatalf("wait %v, want %v (plan %+v)", plan.Wait, tc.wait, plan)
			}
			if !slices.Equal(plan.Ignored, tc.ignored) {
				t.Fatalf("ignored %v, want %v", plan.Ignored, tc.ignored)
			}
			got := map[int][]string{}
			for _, gc := range plan.Groups {
				for _, s := range gc.Servers {
					if s.Suffrage != raft.Voter || string(s.Address) != string(s.ID)+":7301" {
						t.Fatalf("group %d: server %+v is not a voter at its member's raft address", gc.Group, s)
					}
				}
				got[gc.Group] = ids(gc.Servers)
			}
			if tc.wait {
				return
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.groups) {
				t.Fatalf("bootstraps %v, want %v", got, tc.groups)
			}
		})
	}
}

// With two nodes per zone, each group is bootstrapped by exactly its three
// voters (one per zone), and they all compute the same configuration.
func TestPlanBootstrapTwoNodesPerZone(t *testing.T) {
	var ms []membership.Member
	for i := range 6 {
		ms = append(ms, aliveM(fmt.Sprintf("n%d", i), fmt.Sprintf("z%d", i/2)))
	}
	const groups = 16
	confs := map[int]map[string][]string{} // group → self → configuration
	for _, self := range ms {
		plan := planBootstrap(bootstrapInput{Self: self.ID, Expect: 6, Replicas: 3, Members: ms, HasState: make([]bool, groups)})
		for _, gc := range plan.Groups {
			if confs[gc.Group] == nil {
				confs[gc.Group] = map[string][]string{}
			}
			confs[gc.Group][self.ID] = ids(gc.Servers)
		}
	}
	hosts := map[string]int{}
	for g := range groups {
		byself := confs[g]
		if len(byself) != 3 {
			t.Fatalf("group %d bootstrapped by %d nodes (%v), want its 3 voters", g, len(byself), byself)
		}
		for self, conf := range byself {
			if !slices.Contains(conf, self) {
				t.Fatalf("group %d: %s bootstraps a configuration without itself: %v", g, self, conf)
			}
			if fmt.Sprint(conf) != fmt.Sprint(byself[conf[0]]) {
				t.Fatalf("group %d: configurations differ between nodes: %v", g, byself)
			}
			zones := map[byte]bool{}
			for _, id := range conf {
				zones[id[1]/2] = true // n0,n1 → z0 …
				hosts[id]++
			}
			if len(zones) != 3 {
				t.Fatalf("group %d: voters %v not one per zone", g, conf)
			}
		}
	}
	if len(hosts) != 6 {
		t.Fatalf("16 groups placed on only %d of 6 nodes: %v", len(hosts), hosts)
	}
}

func TestPlanReconcile(t *testing.T) {
	type add struct{ id, reason string }
	moved := voterS("a")
	moved.Address = "old:7301"
	nonvoter := voterS("b")
	nonvoter.Suffrage = raft.Nonvoter
	// Two joining nodes in z3: placement picks one of them for this group.
	pick := func(g int, ms []membership.Member, zone string) string {
		for _, m := range Placement(g, ms, 3) {
			if m.Zone == zone {
				return m.ID
			}
		}
		return ""
	}
	other := func(id string) string { // the other z3 node of twoInZ3
		if id == "c1" {
			return "c2"
		}
		return "c1"
	}
	decom := func(m membership.Member) membership.Member { m.Decommissioning = true; return m }
	twoInZ3 := []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c1", "z3"), aliveM("c2", "z3")}
	failedVoter := []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), failedM("c", "z3"), aliveM("c2", "z3")}
	oneZone := []membership.Member{aliveM("a", "z1"), aliveM("b", "z1"), aliveM("c", "z1"), aliveM("d", "z1")}
	var topUp []add
	for _, m := range Placement(5, oneZone, 3) {
		if m.ID != "a" {
			topUp = append(topUp, add{m.ID, reasonTooFew})
		}
	}
	// Three voters all in z1, and z2 joins with two nodes: find a group whose
	// placement names both z2 nodes (fewer zones than replicas); z2 must get
	// one voter, not two.
	z1Full := []membership.Member{aliveM("a", "z1"), aliveM("x", "z1"), aliveM("y", "z1"), aliveM("b1", "z2"), aliveM("b2", "z2")}
	bothZ2 := -1
	for g := 0; bothZ2 < 0 && g < 1000; g++ {
		if ps := Placement(g, z1Full, 3); ps[1].Zone == "z2" && ps[2].Zone == "z2" {
			bothZ2 = g
		}
	}
	if bothZ2 < 0 {
		t.Fatal("no group places both z2 nodes; the case below needs one")
	}
	for _, tc := range []struct {
		name    string
		members []membership.Member
		servers []raft.Server
		group   int
		target  []membership.Member // PlaceAll's choice for the group
		want    []add
	}{
		{name: "a zone without a voter gets one, not every member placement names", members: z1Full, group: bothZ2,
			servers: []raft.Server{voterS("a"), voterS("x"), voterS("y")}, want: []add{{Placement(bothZ2, z1Full, 3)[1].ID, reasonZoneEmpty}}},
		{name: "already placed", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3")},
			servers: []raft.Server{voterS("a"), voterS("b"), voterS("c")}},
		{name: "joining node in a zone without a voter", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3")},
			servers: []raft.Server{voterS("a"), voterS("b")}, want: []add{{"c", reasonZoneEmpty}}},
		{name: "two joining nodes in one zone: only placement's choice", members: twoInZ3, group: 3,
			servers: []raft.Server{voterS("a"), voterS("b")}, want: []add{{pick(3, twoInZ3, "z3"), reasonZoneEmpty}}},
		{name: "a failed voter leaves its zone without a voter", members: failedVoter,
			servers: []raft.Server{voterS("a"), voterS("b"), voterS("c")}, want: []add{{"c2", reasonZoneEmpty}}},
		{name: "zone with no alive member: nothing to add", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), failedM("c", "z3")},
			servers: []raft.Server{voterS("a"), voterS("b")}},
		{name: "voter's raft address changed", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2")},
			servers: []raft.Server{moved, voterS("b")}, want: []add{{"a", reasonAddrChanged}}},
		{name: "adopted member of an earlier build's data dir keeps its plain address",
			members: []membership.Member{withInc(aliveM("a", "z1"), "00000000000000a1", true), aliveM("b", "z2")},
			servers: []raft.Server{voterS("a"), voterS("b")}},
		{name: "a new incarnation is not updated in place (incarnation.go replaces it)",
			members: []membership.Member{withInc(aliveM("a", "z1"), "00000000000000b1", false), aliveM("b", "z2")},
			servers: []raft.Server{withIncS(voterS("a"), "00000000000000a1"), voterS("b")}},
		{name: "member without a known raft address is not re-added",
			members: []membership.Member{{ID: "a", Zone: "z1", Status: membership.StatusAlive}, aliveM("b", "z2")},
			servers: []raft.Server{voterS("a"), voterS("b")}},
		{name: "single zone: top up to replicas in placement order", members: oneZone, group: 5,
			servers: []raft.Server{voterS("a")}, want: topUp},
		// A non-voter is a learner whose promotion was cut short (its leader
		// lost leadership): it does not hold its zone, and the learner path
		// finishes it when placement picks it.
		{name: "a nonvoter is not counted for its zone and is promoted when placed",
			members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3")},
			servers: []raft.Server{voterS("a"), nonvoter}, want: []add{{"c", reasonZoneEmpty}, {"b", reasonZoneEmpty}}},
		{name: "configuration unreadable", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2")}},
		// PlaceAll's choice wins over the group's own Placement (planMoves
		// would move the voter there next), while it is alive.
		{name: "two joining nodes in one zone: PlaceAll's choice when it differs", members: twoInZ3, group: 3,
			target:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM(other(pick(3, twoInZ3, "z3")), "z3")},
			servers: []raft.Server{voterS("a"), voterS("b")}, want: []add{{other(pick(3, twoInZ3, "z3")), reasonZoneEmpty}}},
		{name: "PlaceAll's choice is down: the alive one placement names", members: failedVoter,
			target:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), failedM("c", "z3")},
			servers: []raft.Server{voterS("a"), voterS("b"), voterS("c")}, want: []add{{"c2", reasonZoneEmpty}}},
		{name: "PlaceAll's choice is decommissioning: the other", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), decom(aliveM("c1", "z3")), aliveM("c2", "z3")},
			target:  []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c1", "z3")},
			servers: []raft.Server{voterS("a"), voterS("b")}, want: []add{{"c2", reasonZoneEmpty}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []add
			for _, a := range planReconcile(tc.members, 3, tc.target, GroupConfig{Group: tc.group, Servers: tc.servers}) {
				if a.Group != tc.group || a.Member.Status != membership.StatusAlive {
					t.Fatalf("action %+v: wrong group or not an alive member", a)
				}
				got = append(got, add{a.Member.ID, a.Reason})
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("plan %v, want %v", got, tc.want)
			}
		})
	}
}

func diskFull(m membership.Member) membership.Member {
	m.DiskFull = true
	return m
}

func draining(m membership.Member) membership.Member {
	m.Draining = true
	return m
}

func TestPlanBalance(t *testing.T) {
	all := func(ids ...string) []raft.Server {
		var out []raft.Server
		for _, id := range ids {
			out = append(out, voterS(id))
		}
		return out
	}
	led := func(conf []raft.Server, groups ...int) []GroupConfig {
		var out []GroupConfig
		for _, g := range groups {
			out = append(out, GroupConfig{Group: g, Servers: conf})
		}
		return out
	}
	abc := all("a", "b", "c")
	nonvoterC := all("a", "b", "c")
	nonvoterC[2].Suffrage = raft.Nonvoter
	for _, tc := range []struct {
		name    string
		members []membership.Member
		led     []GroupConfig // self is "a"
		want    string        // "group→to", or "" for no move
	}{
		{name: "alone", members: []membership.Member{aliveM("a", "z1")}, led: led(all("a"), 0, 1)},
		{name: "already balanced", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2, 3), aliveM("c", "z3", 4, 5)},
			led: led(abc, 0, 1)},
		{name: "counts differ by one", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 3, 4), aliveM("c", "z3", 5, 6)},
			led: led(abc, 0, 1, 2)},
		{name: "differ by one, this node has fewer", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2, 3), aliveM("c", "z3", 4, 5)},
			led: led(abc, 0)},
		{name: "to the least loaded voter, highest group first", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 4, 5), aliveM("c", "z3")},
			led: led(abc, 0, 1, 2, 3), want: "3→c"},
		{name: "tie: first in configuration order", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3")},
			led: led(all("a", "c", "b"), 0, 1), want: "1→c"},
		{name: "target only a voter of a lower group", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 3, 4), aliveM("c", "z3")},
			led: append(led(abc, 0), led(all("a", "b"), 1, 2)...), want: "0→c"},
		{name: "a failed node is no target", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2), failedM("c", "z3")},
			led: led(abc, 0, 1)},
		{name: "a node whose disk is full is no target", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2), diskFull(aliveM("c", "z3"))},
			led: led(abc, 0, 1)},
		{name: "the next least loaded when the least loaded has a full disk", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), diskFull(aliveM("c", "z3"))},
			led: led(abc, 0, 1, 2), want: "2→b"},
		{name: "a stopping (draining) node is no target", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2), draining(aliveM("c", "z3"))},
			led: led(abc, 0, 1)},
		{name: "the next least loaded when the least loaded is stopping", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), draining(aliveM("c", "z3"))},
			led: led(abc, 0, 1, 2), want: "2→b"},
		{name: "a node that leads only the groups it started with is no target for a raised one", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2, 3), leadsBelow(aliveM("c", "z3"), 4)},
			led: led(abc, 5, 6, 7)},
		{name: "… and is one for a group it started with", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2, 3), leadsBelow(aliveM("c", "z3"), 4)},
			led: led(abc, 1, 6, 7), want: "1→c"},
		{name: "a nonvoter is no target", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2), aliveM("c", "z3")},
			led: led(nonvoterC, 0, 1)},
		{name: "a member outside the configuration is no target", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 2), aliveM("d", "z1")},
			led: led(abc, 0, 1)},
		{name: "own count from raft, not the stale gossiped tag", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2", 3), aliveM("c", "z3", 4)},
			led: led(abc, 0, 1, 2), want: "2→b"},
		{name: "stale own tag claiming more is ignored too", members: []membership.Member{aliveM("a", "z1", 0, 1, 2, 3), aliveM("b", "z2", 4), aliveM("c", "z3", 5)},
			led: led(abc, 0)},
		{name: "unreadable configuration is skipped", members: []membership.Member{aliveM("a", "z1"), aliveM("b", "z2"), aliveM("c", "z3", 3)},
			led: append(led(abc, 0), GroupConfig{Group: 1}, GroupConfig{Group: 2}), want: "0→b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mv, ok := PlanBalance(BalanceInput{Self: "a", Members: tc.members, Led: tc.led})
			got := ""
			if ok {
				got = fmt.Sprintf("%d→%s", mv.Group, mv.To.ID)
				if mv.LedHere != len(tc.led) || mv.LedThere > mv.LedHere-2 || mv.To.Address != raft.ServerAddress(string(mv.To.ID)+":7301") {
					t.Fatalf("move %+v: counts or address wrong (led here %d)", mv, len(tc.led))
				}
			}
			if got != tc.want {
				t.Fatalf("plan %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPlanBalanceConverges runs the planner on every node of a simulated
// cluster (perfect knowledge, transfers always land) from random leader
// assignments: it must stop moving, and only once counts are within one. A
// planner that oscillates fails on the step bound; one that stops early fails
// on the spread.
func TestPlanBalanceConverges(t *testing.T) {
	for _, sz := range []struct{ nodes, groups int }{{3, 6}, {3, 7}, {3, 64}, {5, 16}, {2, 1}} {
		for seed := range uint64(20) {
			rng := rand.New(rand.NewPCG(seed, uint64(sz.nodes*1000+sz.groups)))
			var conf []raft.Server
			for i := range sz.nodes {
				conf = append(conf, voterS(fmt.Sprintf("n%d", i)))
			}
			leader := make([]int, sz.groups) // group → node index
			for g := range leader {
				// Skewed start: most groups on node 0.
				if rng.IntN(4) > 0 {
					leader[g] = 0
				} else {
					leader[g] = rng.IntN(sz.nodes)
				}
			}
			snapshot := func(self int) BalanceInput {
				in := BalanceInput{Self: fmt.Sprintf("n%d", self)}
				for i := range sz.nodes {
					m := aliveM(fmt.Sprintf("n%d", i), fmt.Sprintf("z%d", i))
					for g, l := range leader {
						if l == i {
							m.GroupsLed = append(m.GroupsLed, g)
						}
					}
					in.Members = append(in.Members, m)
				}
				for _, g := range in.Members[self].GroupsLed {
					in.Led = append(in.Led, GroupConfig{Group: g, Servers: conf})
				}
				return in
			}
			counts := func() []int {
				c := make([]int, sz.nodes)
				for _, l := range leader {
					c[l]++
				}
				return c
			}
			start := fmt.Sprint(counts())
			for step := 0; ; step++ {
				if step > sz.groups*sz.nodes {
					t.Fatalf("%d nodes, %d groups, seed %d: still moving after %d steps (from %s, now %v)", sz.nodes, sz.groups, seed, step, start, counts())
				}
				moved := false
				for _, self := range rng.Perm(sz.nodes) {
					if mv, ok := PlanBalance(snapshot(self)); ok {
						if leader[mv.Group] != self {
							t.Fatalf("node %d moves group %d it does not lead", self, mv.Group)
						}
						fmt.Sscanf(string(mv.To.ID), "n%d", &leader[mv.Group])
						moved = true
						break
					}
				}
				if !moved {
					break
				}
			}
			c := counts()
			if slices.Max(c)-slices.Min(c) > 1 {
				t.Fatalf("%d nodes, %d groups, seed %d: planner stops at %v (from %s), not within one", sz.nodes, sz.groups, seed, c, start)
			}
		}
	}
}

func TestPlanBalanceDelayJitter(t *testing.T) {
	iv := 10 * time.Second
	lo := BalanceDelay(iv, func(time.Duration) time.Duration { return 0 })
	hi := BalanceDelay(iv, func(n time.Duration) time.Duration { return n - 1 })
	if lo != 7500*time.Millisecond || hi != 12500*time.Millisecond {
		t.Fatalf("delay range [%v, %v], want [7.5s, 12.5s]", lo, hi)
	}
}

func leadsBelow(m membership.Member, n int) membership.Member { m.LeadGroups = n; return m }
