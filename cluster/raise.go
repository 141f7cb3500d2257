package cluster

import (
	"slices"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

// RaiseVoters places the groups a raise adds, from..to-1: for each, the
// voters Placement chooses (one per zone, topped up to replicas) among the
// members that are alive, not being drained and voters of group 0 (order,
// the configuration of group 0, whose log carries the raise), so that a new
// group forms from nodes that can vote now. The result goes into the
// layout-raise entry, and every voter bootstraps its group with exactly that
// configuration: only group 0's voters apply that entry, so only they are
// candidates (a node outside group 0 learns the raise from group 0's leader,
// creates the groups empty and can be added later). Placement over all
// nodes follows through the learner path (planMoves), and members that are
// down are placed by the reconcile loop like any group's missing voter. An
// order without servers (a test's) leaves every member a candidate. Element
// i is group from+i's; nil when no member qualifies.
func RaiseVoters(from, to int, members []membership.Member, replicas int, order raft.Configuration) [][]raft.Server {
	var cands []membership.Member
	for _, m := range aliveByID(members) {
		inOrder := len(order.Servers) == 0 || slices.ContainsFunc(order.Servers, func(s raft.Server) bool {
			return string(s.ID) == m.ID && s.Suffrage == raft.Voter
		})
		if !m.Decommissioning && m.RaftAddr != "" && inOrder {
			cands = append(cands, m)
		}
	}
	if len(cands) == 0 || from >= to {
		return nil
	}
	out := make([][]raft.Server, 0, to-from)
	for g := from; g < to; g++ {
		var servers []raft.Server
		for _, v := range Placement(g, cands, replicas) {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.RaftAddr)})
		}
		out = append(out, servers)
	}
	return out
}
