package cluster

import (
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

// The cluster duties of a node — bootstrap a new cluster, repair group
// placement, balance leadership — are decided here by pure planners: each
// takes a snapshot of what the node knows (members with zones and status,
// groups' raft configurations, which groups it leads) and returns the actions
// to take. They do no I/O and read no clock, so table tests cover every case;
// controller.go gathers the snapshot through the port (port.go) and executes
// the plan.

// GroupConfig is one group's raft configuration as the planners see it. Nil
// Servers means the configuration could not be read: such a group gets no
// action.
type GroupConfig struct {
	Group   int
	Servers []raft.Server
}

// aliveByID returns the alive members sorted by id (the order every node
// agrees on, whatever order serf listed them in).
func aliveByID(ms []membership.Member) []membership.Member {
	out := alive(ms)
	slices.SortFunc(out, func(a, b membership.Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// bootstrapInput is what a node knows when it considers forming a new cluster.
type bootstrapInput struct {
	Self     string
	Expect   int                 // --bootstrap-expect
	Replicas int                 // voters per group
	Members  []membership.Member // as serf lists them; only alive ones count
	HasState []bool              // per group: this node already has raft state for it
}

// bootstrapPlan says which groups this node bootstraps, each with the full
// configuration every expected node computes identically.
type bootstrapPlan struct {
	Wait    bool          // fewer than Expect members alive: nothing to do yet
	Ignored []string      // alive members beyond Expect (by id), left out of every configuration
	Groups  []GroupConfig // groups to bootstrap here, ascending
}

// planBootstrap: once Expect members are alive, every one of them places every
// group over the first Expect by id and bootstraps the groups it is a voter of.
// Because all compute the same configuration, raft treats the bootstraps as
// one. A group with local state, or that some member already leads (the
// cluster exists and this node will be added by that leader), is left alone.
func planBootstrap(in bootstrapInput) bootstrapPlan {
	ms := aliveByID(in.Members)
	if len(ms) < in.Expect {
		return bootstrapPlan{Wait: true}
	}
	var plan bootstrapPlan
	for _, m := range ms[in.Expect:] {
		plan.Ignored = append(plan.Ignored, m.ID)
	}
	ms = ms[:in.Expect]
	for g, has := range in.HasState {
		if has || slices.ContainsFunc(ms, func(m membership.Member) bool { return slices.Contains(m.GroupsLed, g) }) {
			continue
		}
		voters := Placement(g, ms, in.Replicas)
		if !slices.ContainsFunc(voters, func(m membership.Member) bool { return m.ID == in.Self }) {
			continue
		}
		gc := GroupConfig{Group: g}
		for _, v := range voters {
			gc.Servers = append(gc.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.RaftAddr)})
		}
		plan.Groups = append(plan.Groups, gc)
	}
	return plan
}

// Why a voter is added; logged with the action.
const (
	reasonAddrChanged = "raft address changed"
	reasonZoneEmpty   = "zone has no voter"
	reasonTooFew      = "group has fewer voters than replicas"
)

// addrMoved says whether voter srv's member m, the same incarnation, now
// gossips another raft address than the configuration lists (a restart on
// new ports): the voter is re-added there.
func addrMoved(srv raft.Server, m membership.Member) bool {
	return m.RaftAddr != "" && raft.ServerAddress(listedAddr(srv, m)) != srv.Address && sameIncarnation(srv, m)
}

// voterAdd asks a group's leader to add (or re-add at a new address) a voter.
type voterAdd struct {
	Group  int
	Member membership.Member
	Reason string
}

// planReconcile repairs the placement of one group this node leads (each
// addition runs the learner path: non-voter first, promoted once caught up): a voter
// whose raft address changed is re-added at the new one; a zone with alive
// members but no alive voter gets placement's choice for that zone; voters are
// topped up to replicas with placement's next choices. Placement's choice is
// target (PlaceAll's for the group, what planMoves converges to) where that
// member is alive, so a repair is not followed by a move; else Placement's
// among the alive members. It never removes a server: removal is an operator
// decision (raft remove-server), and a removed node stays out until it joins
// again.
func planReconcile(members []membership.Member, replicas int, target []membership.Member, gc GroupConfig) []voterAdd {
	if gc.Servers == nil {
		return nil
	}
	ms := aliveByID(members)
	byID := map[string]membership.Member{}
	for _, m := range ms {
		byID[m.ID] = m
	}
	var plan []voterAdd
	inConf := map[string]bool{}
	zones := map[string]bool{} // zones with an alive voter
	voters := 0
	for _, srv := range gc.Servers {
		if srv.Suffrage != raft.Voter {
			// A non-voter is a learner whose promotion was cut short (its
			// leader lost leadership or stopped): placement may finish it.
			continue
		}
		inConf[string(srv.ID)] = true
		voters++
		if m, ok := byID[string(srv.ID)]; ok {
			zones[m.Zone] = true
			// Only the same incarnation moves in place; a new one is
			// replaced through the non-voter path (incarnation.go).
			if addrMoved(srv, m) {
				m.RaftAddr = listedAddr(srv, m)
				plan = append(plan, voterAdd{gc.Group, m, reasonAddrChanged})
			}
		}
	}
	eligible := slices.DeleteFunc(slices.Clone(ms), func(m membership.Member) bool { return m.Decommissioning })
	var order []membership.Member
	for _, m := range target {
		if a, ok := byID[m.ID]; ok && !a.Decommissioning {
			order = append(order, a)
		}
	}
	for _, m := range Placement(gc.Group, eligible, replicas) {
		if !slices.ContainsFunc(order, func(o membership.Member) bool { return o.ID == m.ID }) {
			order = append(order, m)
		}
	}
	for _, m := range order {
		if inConf[m.ID] {
			continue
		}
		switch {
		case !zones[m.Zone]:
			plan = append(plan, voterAdd{gc.Group, m, reasonZoneEmpty})
			zones[m.Zone] = true
			voters++
		case voters < replicas:
			plan = append(plan, voterAdd{gc.Group, m, reasonTooFew})
			voters++
		}
	}
	return plan
}

// BalanceInput is what a node knows when it considers handing off leadership.
type BalanceInput struct {
	Self    string
	Members []membership.Member // with the groups each leads as gossiped; only alive ones count
	Led     []GroupConfig       // the groups this node leads (per raft), ascending
}

// LeaderMove transfers leadership of Group from this node to To.
type LeaderMove struct {
	Group    int
	To       raft.Server
	LedHere  int // groups this node leads
	LedThere int // groups To leads
}

// PlanBalance picks at most one leadership transfer: a group led here whose
// voters include an alive node (whose disk takes writes) leading at least two
// fewer groups, the least
// loaded such voter (first in configuration order on a tie), starting from the
// highest-numbered group led here. Each step lowers the spread, so counts
// converge to within one of each other (a leader does its group's deciding
// and fsyncs). One move per call, and calls jittered (BalanceDelay), keeps
// nodes from all dumping on the same target at once.
func PlanBalance(in BalanceInput) (LeaderMove, bool) {
	ms := alive(in.Members)
	if len(ms) < 2 {
		return LeaderMove{}, false
	}
	counts := map[string]int{}
	byID := map[string]membership.Member{}
	for _, m := range ms {
		byID[m.ID] = m
		if m.DiskFull {
			continue // it would step down at its first log write
		}
		if m.Draining {
			continue // stopping: it would take the leadership down with it
		}
		if m.Decommissioning {
			continue // its replicas are moving away
		}
		counts[m.ID] = len(m.GroupsLed)
	}
	// Raft knows this node's own count better than its gossiped tag does.
	mine := len(in.Led)
	counts[in.Self] = mine
	for i := len(in.Led) - 1; i >= 0; i-- {
		gc := in.Led[i]
		var best *raft.Server
		bestN := mine - 1 // the target must lead ≤ mine-2
		for _, srv := range gc.Servers {
			n, ok := counts[string(srv.ID)]
			if srv.Suffrage != raft.Voter || string(srv.ID) == in.Self || !ok || !byID[string(srv.ID)].MayLead(gc.Group) {
				continue // (a group a raise added while the node ran: it leads it from its restart)
			}
			if n < bestN {
				best, bestN = &srv, n
			}
		}
		if best != nil {
			return LeaderMove{Group: gc.Group, To: *best, LedHere: mine, LedThere: bestN}, true
		}
	}
	return LeaderMove{}, false
}

// BalanceDelay is the wait before the next balance check: the interval ±25 %
// (rnd(n) returns a value in [0, n)), so nodes do not decide at the same
// instant.
func BalanceDelay(iv time.Duration, rnd func(time.Duration) time.Duration) time.Duration {
	return iv*3/4 + rnd(iv/2+1)
}

// Why a replica moves; logged with the action.
const (
	reasonRebalance    = "rebalance: placement prefers another node of the zone"
	reasonDecommission = "node is draining (tollgate node drain)"
	reasonSurplus      = "group has a voter beyond its placement"
)

// moveInput is what a leader knows when it considers moving a replica.
type moveInput struct {
	Self     string
	Groups   int                 // G
	Replicas int                 // voters per group
	Members  []membership.Member // every known member, any status
	Led      []GroupConfig       // the groups this node leads, ascending
}

// placementMove is one step towards PlaceAll's placement of one group. Exactly
// one of three shapes:
//   - Add set, Remove set: add Add through the learner path, then remove
//     Remove (the group never has fewer than its voters: one more for the
//     duration of the move);
//   - Add zero, Remove set: remove a surplus voter;
//   - Transfer set: this node is the one to remove, so it first hands the
//     group's leadership to Transfer; the next leader makes the move.
type placementMove struct {
	Group    int
	Add      membership.Member
	Remove   string
	Transfer *raft.Server
	Reason   string
}

// placementCandidates are the members placement may choose: every member but
// the decommissioned ones. A member that is down or restarting (failed,
// left, leaving) keeps its place, so an outage or a rolling restart moves
// nothing: the zone repair of planReconcile keeps the group whole meanwhile,
// and the member's replicas stay where they are for when it is back.
func placementCandidates(ms []membership.Member) []membership.Member {
	var out []membership.Member
	for _, m := range ms {
		if !m.Decommissioning {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b membership.Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// healthy: a member a replica may move to, or whose voter makes another in
// its zone surplus: alive, not stopping, its disk taking writes.
func healthy(m membership.Member) bool {
	return m.Status == membership.StatusAlive && !m.Draining && !m.DiskFull
}

// planMoves picks at most one move for the groups led here (lowest group
// first): a target of PlaceAll that is healthy and not yet a voter replaces a
// voter placement does not want (of its zone when there is one), or a surplus
// voter goes once its zone has a healthy voter placement wants. Moves towards
// a member that is down wait for it; repairs of a group that lacks a voter
// are planReconcile's. One move at a time per leader, rate-limited by the
// caller, keeps the extra catch-up traffic bounded.
func planMoves(in moveInput) (placementMove, bool) {
	cands := placementCandidates(in.Members)
	if len(cands) == 0 {
		return placementMove{}, false
	}
	targets := PlaceAll(in.Groups, cands, in.Replicas)
	byID := map[string]membership.Member{}
	for _, m := range in.Members {
		byID[m.ID] = m
	}
	for _, gc := range in.Led {
		if gc.Servers == nil || gc.Group >= len(targets) {
			continue
		}
		target := map[string]bool{}
		for _, m := range targets[gc.Group] {
			target[m.ID] = true
		}
		var voters []raft.Server
		isVoter := map[string]bool{}
		for _, srv := range gc.Servers {
			if srv.Suffrage == raft.Voter {
				voters = append(voters, srv)
				isVoter[string(srv.ID)] = true
			}
		}
		// The voter a move removes: one placement does not want, of the
		// new voter's zone when there is one, a decommissioned one first.
		zoneVoters, zoneSlots := map[string]int{}, map[string]int{}
		for _, v := range voters {
			zoneVoters[byID[string(v.ID)].Zone]++
		}
		for _, m := range targets[gc.Group] {
			zoneSlots[m.Zone]++
		}
		source := func(zone string) (string, bool) {
			best, bestRank := "", 99
			for _, v := range voters {
				id := string(v.ID)
				if target[id] {
					continue
				}
				m, known := byID[id]
				rank := 2
				switch {
				case known && m.Zone == zone:
					rank = 0
				case known && zoneVoters[m.Zone] <= zoneSlots[m.Zone]:
					// Taking it would leave its zone short of what
					// placement gives that zone.
					continue
				}
				if known && m.Decommissioning {
					rank--
				}
				if rank < bestRank {
					best, bestRank = id, rank
				}
			}
			return best, best != ""
		}
		handOff := func(remove, reason string) (placementMove, bool) {
			// This node is to leave the group: a healthy target voter
			// leads it next and makes the move.
			// Failing that (every voter is to go, as when a whole
			// cluster's nodes are drained onto new ones) another healthy
			// voter does: it has a move to make that is not its own.
			for _, wantTarget := range []bool{true, false} {
				for _, v := range voters {
					id := string(v.ID)
					if id != in.Self && target[id] == wantTarget && healthy(byID[id]) && byID[id].MayLead(gc.Group) {
						return placementMove{Group: gc.Group, Remove: remove, Transfer: &v, Reason: reason}, true
					}
				}
			}
			return placementMove{}, false
		}
		reasonFor := func(remove string) string {
			if byID[remove].Decommissioning {
				return reasonDecommission
			}
			return reasonRebalance
		}
		for _, t := range targets[gc.Group] {
			if isVoter[t.ID] || !healthy(byID[t.ID]) {
				continue
			}
			rm, ok := source(t.Zone)
			if !ok {
				break // fewer voters than placement wants: planReconcile's
			}
			if rm == in.Self {
				if mv, ok := handOff(rm, reasonFor(rm)); ok {
					return mv, true
				}
				break
			}
			return placementMove{Group: gc.Group, Add: byID[t.ID], Remove: rm, Reason: reasonFor(rm)}, true
		}
		if len(voters) > in.Replicas {
			covered := map[string]bool{} // zones with a healthy voter placement wants
			for _, m := range targets[gc.Group] {
				if isVoter[m.ID] && healthy(byID[m.ID]) {
					covered[m.Zone] = true
				}
			}
			for _, v := range voters {
				id := string(v.ID)
				m, known := byID[id]
				if target[id] || !known || !covered[m.Zone] {
					continue
				}
				if id == in.Self {
					if mv, ok := handOff(id, reasonSurplus); ok {
						return mv, true
					}
					continue
				}
				return placementMove{Group: gc.Group, Remove: id, Reason: reasonSurplus}, true
			}
		}
	}
	return placementMove{}, false
}
