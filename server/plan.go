package server

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
// cluster.go gathers the snapshot from serf and raft and executes the plan.

// groupConfig is one group's raft configuration as the planners see it. Nil
// Servers means the configuration could not be read: such a group gets no
// action.
type groupConfig struct {
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
	Groups  []groupConfig // groups to bootstrap here, ascending
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
		gc := groupConfig{Group: g}
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
// topped up to replicas with placement's next choices. It never removes a
// server: removal is an operator decision (raft remove-server), and a removed
// node stays out until it joins again.
func planReconcile(members []membership.Member, replicas int, gc groupConfig) []voterAdd {
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
			if want := listedAddr(srv, m); m.RaftAddr != "" && raft.ServerAddress(want) != srv.Address && sameIncarnation(srv, m) {
				m.RaftAddr = want
				plan = append(plan, voterAdd{gc.Group, m, reasonAddrChanged})
			}
		}
	}
	for _, m := range Placement(gc.Group, ms, replicas) {
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

// balanceInput is what a node knows when it considers handing off leadership.
type balanceInput struct {
	Self    string
	Members []membership.Member // with the groups each leads as gossiped; only alive ones count
	Led     []groupConfig       // the groups this node leads (per raft), ascending
}

// leaderMove transfers leadership of Group from this node to To.
type leaderMove struct {
	Group    int
	To       raft.Server
	LedHere  int // groups this node leads
	LedThere int // groups To leads
}

// planBalance picks at most one leadership transfer: a group led here whose
// voters include an alive node (whose disk takes writes) leading at least two
// fewer groups, the least
// loaded such voter (first in configuration order on a tie), starting from the
// highest-numbered group led here. Each step lowers the spread, so counts
// converge to within one of each other (a leader does its group's deciding
// and fsyncs). One move per call, and calls jittered (balanceDelay), keeps
// nodes from all dumping on the same target at once.
func planBalance(in balanceInput) (leaderMove, bool) {
	ms := alive(in.Members)
	if len(ms) < 2 {
		return leaderMove{}, false
	}
	counts := map[string]int{}
	for _, m := range ms {
		if m.DiskFull {
			continue // it would step down at its first log write
		}
		if m.Draining {
			continue // stopping: it would take the leadership down with it
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
			if srv.Suffrage != raft.Voter || string(srv.ID) == in.Self || !ok {
				continue
			}
			if n < bestN {
				best, bestN = &srv, n
			}
		}
		if best != nil {
			return leaderMove{Group: gc.Group, To: *best, LedHere: mine, LedThere: bestN}, true
		}
	}
	return leaderMove{}, false
}

// balanceDelay is the wait before the next balance check: the interval ±25 %
// (rnd(n) returns a value in [0, n)), so nodes do not decide at the same
// instant.
func balanceDelay(iv time.Duration, rnd func(time.Duration) time.Duration) time.Duration {
	return iv*3/4 + rnd(iv/2+1)
}
