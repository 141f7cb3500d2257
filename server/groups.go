package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/raftnode"
)

// Raft groups created at runtime (issue 38). raftnode adds a group to a
// running host and lists it in its data dir (Host.AddGroup). A node starts
// with the per-group state (FSMs, trackers, group clocks, shares, metering,
// runtime-config replicas, metrics) of max(configured G, listed groups)
// (startGroups), so a restart after a group was added serves it. The layout
// table's own count is not read here: it lives in group 0, which is replayed
// after the state machines must exist. A group added while the node runs
// still gets only its raft until the node restarts.

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

// startGroups fixes the node's group counts before anything is built: it
// checks cfg against the layout recorded in the data dir (checkLayout),
// returns the recorded count (the base of the layout's arithmetic: the
// groups created with the cluster own their arithmetic range of base
// groups, the groups a raise added own none, layout.GroupSpan) and raises
// cfg.Layout.Groups to the raft groups the data dir lists.
func startGroups(cfg *Config) (base int, err error) {
	listed, err := raftnode.ListedGroups(filepath.Join(cfg.Node.DataDir, "raft"))
	if err != nil {
		return 0, fmt.Errorf("start raft: %w", err)
	}
	if base, err = checkLayout(*cfg, listed); err != nil {
		return 0, err
	}
	cfg.Layout.Groups = max(cfg.Layout.Groups, listed)
	return base, nil
}

// newGroupFSM is the state machine of group g, added at runtime to a node
// that will run groups groups: empty (a group added by a raise owns no
// partition) and carrying the modules a restart gives it (fsmModules: shares,
// runtime config, metering, in that order; the layout table is group 0's
// only), so that its log and snapshots replay into the state the restarted
// node builds. Its modules are its own until then: no component reads them.
func (s *Server) newGroupFSM(g, groups int) (*fsm.FSM, error) {
	sh, err := shares.New(g, groups)
	if err != nil {
		return nil, err
	}
	return fsm.New(fsm.Config{Partitions: s.cfg.Layout.Partitions, Groups: groups, Shards: s.cfg.Layout.Shards, Group: g, Base: s.base,
		Logger: s.log, MaxClusterVersion: s.cfg.Cluster.MaxClusterVersion,
		Modules: []fsm.Module{sh, runtimecfg.New(nil), fsmmeter.New(g)}})
}
