package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/fsm"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/raftnode"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
)

// Raft groups created at runtime (issue 38, docs/online-groups.md). A node
// starts with the per-group state of max(configured G, the raft groups its
// data dir lists) (startGroups): the layout table's count lives in group 0,
// replayed after the state machines must exist. A group a raise adds while
// the node runs gets its raft and state machine only, until a restart.

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
// runtime config, metering, partition moves, in that order; the layout table
// is group 0's only), so that its log and snapshots replay into the state the restarted
// node builds. Its modules are its own until then: no component reads them.
func (s *Server) newGroupFSM(g, groups int) (*fsm.FSM, error) {
	sh, err := shares.New(g, sharessvc.ModuleGroups(g, s.base))
	if err != nil {
		return nil, err
	}
	pm := partmove.New(g, s.cfg.Layout.Partitions, s.base)
	f, err := fsm.New(fsm.Config{Partitions: s.cfg.Layout.Partitions, Groups: groups, Shards: s.cfg.Layout.Shards, Group: g, Base: s.base,
		Logger: s.log, MaxClusterVersion: s.cfg.Cluster.MaxClusterVersion,
		Modules: []fsm.Module{sh, runtimecfg.New(nil), fsmmeter.New(g), pm}})
	if err != nil {
		return nil, err
	}
	pm.Bind(f, sh)
	return f, nil
}

// newGrowth builds the node's part in a raise (cluster.Growth): create the
// groups the layout table names, empty, and bootstrap those this node is a
// voter of.
func (s *Server) newGrowth() *cluster.Growth {
	return cluster.NewGrowth(cluster.GrowthConfig{NodeID: s.cfg.Node.ID, Log: s.log,
		Groups:    func() int { return s.host.Groups() },
		Want:      func() int { return s.layout.Current().Groups }, // a learned table too (layout.go)
		Add:       s.addRaftGroup,
		Bootstrap: func(g int, servers []raft.Server) error { return s.host.BootstrapGroup(g, servers) },
		NewFSM:    func(g, groups int) (raft.FSM, error) { return s.newGroupFSM(g, groups) },
	})
}

// layoutChanged runs on group 0's apply goroutine (a set, a raise, a
// restore), possibly while New still runs: quick, it reads nothing New
// writes and only wakes the growth loop.
func (s *Server) layoutChanged(t *layout.Table) {
	if t.Groups > s.cfg.Layout.Groups {
		s.grow.Poke()
	}
}

// raiseApplied hands a layout-raise's voters to the growth loop (apply
// goroutine).
func (s *Server) raiseApplied(r fsmlayout.RaiseApplied) { s.grow.Raised(r.From, r.Servers()) }

// raiseGroups raises the cluster's group count to n on group 0's leader
// (Admin.RaiseGroups).
func (s *Server) raiseGroups(ctx context.Context, n int) (*api.RaiseGroupsResponse, error) {
	from, res, err := s.layout.Raise(ctx, n, func(from, to int) [][]raft.Server {
		if ms := s.memberList(); !s.cfg.Cluster.Bootstrap || len(ms) == 1 { // a --dev node bootstraps each group it creates alone (raftnode)
			return cluster.RaiseVoters(from, to, ms, s.cfg.Cluster.Replicas, s.host.Raft(0).GetConfiguration().Configuration())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("group count raised", "from", from, "groups", res.Groups, "changed", res.Changed, "epoch", res.Epoch)
	return &api.RaiseGroupsResponse{From: uint32(from), Groups: uint32(res.Groups), Changed: res.Changed, Epoch: res.Epoch}, nil
}

// RaiseGroups raises the cluster's group count to n (Admin.RaiseGroups:
// forwarded to group 0's leader).
func (s *Server) RaiseGroups(ctx context.Context, n int) (*api.RaiseGroupsResponse, error) {
	return s.admin.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: uint32(n)})
}

// RaftGroups is the number of raft groups this node runs (a raise adds
// some before a restart gives them their per-group state).
func (s *Server) RaftGroups() int { return s.host.Groups() }
