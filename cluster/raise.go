package cluster

import (
	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

// RaiseVoters places the groups a raise adds, from..to-1: for each, the
// voters Placement chooses (one per zone, topped up to replicas) among the
// members that are alive and not being drained, so that a new group forms
// from nodes that can vote now. The result goes into the layout-raise entry,
// and every voter bootstraps its group with exactly that configuration.
// Members that are down are placed later by the reconcile loop like any
// group's missing voter. Element i is group from+i's; nil when no member
// qualifies.
func RaiseVoters(from, to int, members []membership.Member, replicas int) [][]raft.Server {
	var cands []membership.Member
	for _, m := range aliveByID(members) {
		if !m.Decommissioning && m.RaftAddr != "" {
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
