package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/fsm"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/raftnode"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
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
	sh, err := shares.New(g, sharessvc.ModuleGroups(g, s.base))
	if err != nil {
		return nil, err
	}
	return fsm.New(fsm.Config{Partitions: s.cfg.Layout.Partitions, Groups: groups, Shards: s.cfg.Layout.Shards, Group: g, Base: s.base,
		Logger: s.log, MaxClusterVersion: s.cfg.Cluster.MaxClusterVersion,
		Modules: []fsm.Module{sh, runtimecfg.New(nil), fsmmeter.New(g)}})
}

// groupGrowth is the node's part in a raise: every node creates the groups
// the layout table names and it does not run yet, in order, and bootstraps
// those it is a voter of with the configuration the layout-raise entry
// carries (identical on every voter: raft treats the bootstraps as one).
type groupGrowth struct {
	poke   chan struct{}
	mu     sync.Mutex
	voters map[int][]raft.Server // new group → its voters, until bootstrapped here
}

func (s *Server) pokeGrowth() {
	select {
	case s.grow.poke <- struct{}{}:
	default:
	}
}

// layoutChanged runs on group 0's apply goroutine (a set, a raise, a
// restore), possibly while New still runs: quick, it reads nothing New
// writes and only wakes growGroups.
func (s *Server) layoutChanged(t *layout.Table) {
	if t.Groups > s.cfg.Layout.Groups {
		s.pokeGrowth()
	}
}

// raiseApplied keeps the new groups' voters from a layout-raise entry
// (apply goroutine).
func (s *Server) raiseApplied(r fsmlayout.RaiseApplied) {
	s.grow.mu.Lock()
	if s.grow.voters == nil {
		s.grow.voters = map[int][]raft.Server{}
	}
	for i, vs := range r.Raise.Voters {
		servers := make([]raft.Server, 0, len(vs))
		for _, v := range vs {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.Addr)})
		}
		s.grow.voters[r.From+i] = servers
	}
	s.grow.mu.Unlock()
	s.pokeGrowth()
}

// growGroups creates and bootstraps new groups whenever the table asks,
// retrying a failure every second until the node stops.
func (s *Server) growGroups(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	s.pokeGrowth() // the table replayed before this loop started
	failed := false
	for {
		select {
		case <-stop:
			return
		case <-s.grow.poke:
		case <-retry.C:
			if !failed {
				continue
			}
		}
		err := s.createGroups(ctx)
		if failed = err != nil; failed && ctx.Err() == nil {
			s.log.Warn("creating the groups of a raise; retrying", "err", err)
		}
	}
}

// createGroups creates groups host.Groups()..table.Groups-1, each with the
// empty state machine of a raised group, then bootstraps the new groups
// this node is a voter of.
func (s *Server) createGroups(ctx context.Context) error {
	want := s.layout.Module().Current().Groups
	for g := s.host.Groups(); g < want; g++ {
		f, err := s.newGroupFSM(g, want)
		if err != nil {
			return err
		}
		if err := s.addRaftGroup(ctx, g, f); err != nil && !errors.Is(err, raftnode.ErrGroupExists) {
			return err
		}
	}
	s.grow.mu.Lock()
	defer s.grow.mu.Unlock()
	for g, servers := range s.grow.voters {
		if g >= s.host.Groups() {
			continue
		}
		if slices.ContainsFunc(servers, func(v raft.Server) bool { return string(v.ID) == s.cfg.Node.ID }) {
			if err := s.host.BootstrapGroup(g, servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
				return err
			}
		}
		delete(s.grow.voters, g)
	}
	return nil
}

// raiseGroups raises the cluster's group count to n on group 0's leader
// (Admin.RaiseGroups).
func (s *Server) raiseGroups(ctx context.Context, n int) (*api.RaiseGroupsResponse, error) {
	from, res, err := s.layout.Raise(ctx, n, func(from, to int) [][]fsmlayout.Voter {
		var out [][]fsmlayout.Voter
		for _, gc := range cluster.RaiseVoters(from, to, s.memberList(), s.cfg.Cluster.Replicas) {
			vs := make([]fsmlayout.Voter, 0, len(gc.Servers))
			for _, v := range gc.Servers {
				vs = append(vs, fsmlayout.Voter{ID: string(v.ID), Addr: string(v.Address)})
			}
			out = append(out, vs)
		}
		return out
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
