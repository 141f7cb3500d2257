package server

import (
	"fmt"
	"slices"
	"strings"
)

// WaitingFor says, in an operator's words, what this node waits for before it
// is ready, or "" when it is ready. It adds to NotReadyReason what only the
// cluster duties know: a new cluster waiting for its --bootstrap-expect
// members, or a node with no raft state waiting to be added by the leaders.
func (s *Server) WaitingFor() string {
	reason := s.NotReadyReason()
	if reason == "" {
		return ""
	}
	if why := s.identityReason(); why != "" {
		return why
	}
	if s.hasRaftState() {
		return "waiting: " + reason
	}
	switch {
	case s.cfg.Cluster.BootstrapExpect > 0 && s.members != nil:
		var ids []string
		for _, m := range alive(s.memberList()) {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		return fmt.Sprintf("waiting for --bootstrap-expect %d: %d alive (%s)", s.cfg.Cluster.BootstrapExpect, len(ids), strings.Join(ids, ", "))
	case !s.cfg.Cluster.Bootstrap:
		if len(s.cfg.Gossip.Join) == 0 {
			return "waiting to be added to a cluster by its group leaders (no --join given: another node must join this one)"
		}
		return fmt.Sprintf("waiting to be added to a cluster by its group leaders (--join %s)", strings.Join(s.cfg.Gossip.Join, ","))
	}
	return "waiting: " + reason
}

// hasRaftState reports whether any group has raft state on disk here (the node
// was bootstrapped or added to a group at some point).
func (s *Server) hasRaftState() bool {
	for g := range s.host.Groups() {
		if has, err := s.host.GroupHasState(g); err != nil || has {
			return true // an unreadable store is reported by NotReadyReason's words
		}
	}
	return false
}
