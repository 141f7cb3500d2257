package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"github.com/tollgate-io/tollgate/raftnode"
)

// Raft groups created at runtime (issue 38). raftnode adds a group to a
// running host and lists it in its data dir (Host.AddGroup); the node's
// per-group state (FSMs, trackers, group clocks, shares, metering, metrics)
// is still sized by Config.Groups, and the services learn G from it
// (nodePort.Groups), never from the host. Until that state can grow, this is
// the server's whole part: create a group on request, leave its leadership
// alone, and refuse to start over a data dir that lists groups this node has
// no state machine for (New would have nothing to give raft for them).

// addRaftGroup creates raft group g, the next one (Host.Groups()), on this
// node with f as its state machine; with Config.Bootstrap the node is its
// only voter, otherwise its voters bootstrap it (Host.BootstrapGroup) or its
// leader adds this node. The group serves no partition: nothing routes to it.
func (s *Server) addRaftGroup(ctx context.Context, g int, f raft.FSM) error {
	if s.host == nil {
		return errors.New("add raft group: raft is not started")
	}
	if err := s.host.AddGroup(ctx, g, f); err != nil {
		return fmt.Errorf("add raft group %d: %w", g, err)
	}
	s.log.Info("raft group added; it serves no partition yet", "group", g, "groups", s.host.Groups(), "layout_groups", s.cfg.Layout.Groups)
	return nil
}

// servesGroup reports whether group g has the node's per-group state; a
// group added at runtime does not yet.
func (s *Server) servesGroup(g int) bool { return g >= 0 && g < len(s.trackers) }

// checkRaftGroups refuses a raft data dir that lists more groups than the
// node's layout has.
func checkRaftGroups(raftDir string, groups int) error {
	n, err := raftnode.ListedGroups(raftDir)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	if n > groups {
		return fmt.Errorf("start raft: %s holds %d raft groups (groups %d..%d were added at runtime) and this node runs groups=%d: it cannot serve groups beyond its layout yet",
			raftDir, n, groups, n-1, groups)
	}
	return nil
}
