package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/fsm"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	"github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// Raft groups created at runtime (issue 38, docs/online-groups.md). A node
// starts with the per-group state of max(configured G, the raft groups its
// data dir lists) (startGroups): the layout table's count lives in group 0,
// replayed after the state machines must exist. A group a raise adds while
// the node runs gets the same state in place, in the order a start builds
// it: the components' per-group modules and the state machine
// (newGroupFSM), the raft group (addRaftGroup), then its leader path
// (serveGroup). Per-group tables are allocated for every group the layout
// allows (groupCap), so growing one writes an entry nobody reads yet and
// then publishes the count (served): readers index entries below it without
// a lock, and the hot path pays one atomic load.

// groupCap is the number of groups the per-group tables are allocated for:
// a layout never has more groups than partitions. (At the largest layout,
// 65,536 partitions, that is half a megabyte of pointers per table.)
func (s *Server) groupCap() int { return s.cfg.Layout.Partitions }

// servedGroups is the number of groups with the node's per-group state.
func (s *Server) servedGroups() int { return int(s.served.Load()) }

// servesGroup reports whether group g has the node's per-group state; a
// group being added does not yet.
func (s *Server) servesGroup(g int) bool { return g >= 0 && g < s.servedGroups() }

// servedFSMs and servedTrackers are the served groups' state machines and
// leader paths, indexed by group.
func (s *Server) servedFSMs() []*fsm.FSM { return s.fsms[:s.servedGroups()] }

func (s *Server) servedTrackers() []*groupTracker { return s.trackers[:s.servedGroups()] }

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

// newFSM builds group g's state machine with the components' modules, for a
// node running groups groups.
func (s *Server) newFSM(g, groups int) (*fsm.FSM, error) {
	gc := s.clock.Group(g)
	return fsm.New(fsm.Config{Partitions: s.cfg.Layout.Partitions, Groups: groups, Shards: s.cfg.Layout.Shards, Group: g, Logger: s.log,
		Base: s.base, MaxClusterVersion: s.cfg.Cluster.MaxClusterVersion, Modules: s.fsmModules(g),
		OnMinute: func(m int64) { gc.Observe(m * 60_000) }})
}

// newTracker builds group g's leader path (after its raft group exists).
func (s *Server) newTracker(g int) *groupTracker {
	lo, hi := layout.GroupSpan(g, s.cfg.Layout.Partitions, s.base)
	return newGroupTracker(trackerConfig{
		Group:             g,
		PartitionsInGroup: hi - lo,
		Partitions:        s.cfg.Layout.Partitions,
		IdleMinutes:       fsm.IdleAge(int(s.cfg.Tracking.IdleTimeout / time.Minute)),
		ExpireAge:         s.expireAge(g),
		BatchWindow:       s.cfg.Tracking.BatchWindow,
		MaxBatchHashes:    s.cfg.Tracking.MaxBatchHashes,
		MaxInFlight:       s.cfg.Tracking.MaxInFlight,
		ApplyTimeout:      s.cfg.Raft.ApplyTimeout,
		Clock:             func() time.Time { return time.UnixMilli(s.clock.Group(g).Now()) },
		Share:             s.shares.AdmitShare(g),
		OnReset:           s.shares.Module(g).ResetReservations,
		Track:             s.shares.Track,
		Fence:             s.moves.Fence(g),
	}, s.fsms[g], s.host.Raft(g), func() *Limits { return s.groupLimits(g) }, s.log, s.metrics)
}

// newGroupFSM is the state machine of group g, added at runtime to a node
// that will run groups groups: it creates the group's clock and every
// component's per-group state, then the FSM carrying their modules, as a
// start does. A retry after a failed addRaftGroup gets the same FSM: the
// modules exist once.
func (s *Server) newGroupFSM(g, groups int) (*fsm.FSM, error) {
	s.growMu.Lock()
	defer s.growMu.Unlock()
	if g >= s.groupCap() {
		return nil, fmt.Errorf("group %d: a layout of %d partitions has at most %d groups", g, s.cfg.Layout.Partitions, s.groupCap())
	}
	if f := s.fsms[g]; f != nil {
		return f, nil
	}
	if n := s.servedGroups(); g != n {
		return nil, fmt.Errorf("group %d: the next group to add is %d", g, n)
	}
	if s.clock.Groups() == g { // (a retry after a later step failed has it)
		if err := s.clock.AddGroup(g); err != nil {
			return nil, err
		}
	}
	if err := s.addGroupComponents(g); err != nil { // components.go
		return nil, err
	}
	f, err := s.newFSM(g, groups)
	if err != nil {
		return nil, err
	}
	s.pmods[g].Bind(f, s.shares.Module(g), s.meterMods[g])
	s.fsms[g] = f
	return f, nil
}

// addRaftGroup creates raft group g, the next one (Host.Groups()), on this
// node with f as its state machine, then serves it; with Config.Bootstrap
// the node is its only voter, otherwise its voters bootstrap it
// (Host.BootstrapGroup) or its leader adds this node. The group serves no
// partition until one is moved to it.
func (s *Server) addRaftGroup(ctx context.Context, g int, f raft.FSM) error {
	if s.host == nil {
		return errors.New("add raft group: raft is not started")
	}
	if g >= s.host.Groups() || s.servesGroup(g) { // (a retry after serveGroup failed finds it created)
		if err := s.host.AddGroup(ctx, g, f); err != nil {
			return fmt.Errorf("add raft group %d: %w", g, err)
		}
	}
	if err := s.serveGroup(g); err != nil {
		return fmt.Errorf("serve raft group %d: %w", g, err)
	}
	s.log.Info("raft group added and served; it owns no partition until one moves to it", "group", g, "groups", s.host.Groups(), "created_with", s.base)
	return nil
}

// serveGroup gives group g, whose state machine and raft group exist, its
// leader path and publishes it: from here requests reach it, the node may
// campaign for it (groupMayCampaign) and peers may hand it the group's
// leadership (the "lg" gossip tag).
func (s *Server) serveGroup(g int) error {
	s.growMu.Lock()
	defer s.growMu.Unlock()
	select {
	case <-s.stop:
		return raftnode.ErrShutdown
	default:
	}
	if s.servesGroup(g) {
		return nil
	}
	if n := s.servedGroups(); g != n || s.fsms[g] == nil {
		return fmt.Errorf("group %d: the next group to serve is %d", g, n)
	}
	s.trackers[g] = s.newTracker(g)
	s.metrics.initGroup(g)
	s.served.Store(int32(g + 1))
	for _, c := range s.comps {
		if c.served != nil {
			c.served(g)
		}
	}
	if s.members != nil {
		if err := s.members.SetLeadGroups(g + 1); err != nil {
			s.log.Warn("gossip: the groups this node may lead", "groups", g+1, "err", err)
		}
	}
	// A leadership event raft sent before the group was served was dropped
	// (watchLeadership): ask again.
	if s.host.Raft(g).State() == raft.Leader {
		select {
		case s.leaderEvents <- leaderEvent{group: g, leader: true, recheck: true}:
		default:
		}
	}
	return nil
}

// newGrowth builds the node's part in a raise (cluster.Growth): create the
// groups the layout table names, empty, and bootstrap those this node is a
// voter of.
func (s *Server) newGrowth() *cluster.Growth {
	return cluster.NewGrowth(cluster.GrowthConfig{NodeID: s.cfg.Node.ID, Log: s.log,
		Groups:    s.servedGroups,                                  // a group created but not served yet is retried (addRaftGroup)
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
	if t.Groups > s.servedGroups() {
		s.grow.Poke()
	}
}

// raiseApplied hands a layout-raise's voters to the growth loop (apply
// goroutine).
func (s *Server) raiseApplied(r fsmlayout.RaiseApplied) { s.grow.Raised(r.From, r.Servers()) }

// raiseGate refuses a raise (FailedPrecondition naming the members that
// lag) until every member of the cluster runs a build that moves partitions
// online with their metering (fsm/partmove.MeteringClusterVersion; a build
// of partmove.ClusterVersion moves series only, and the partitions it moves
// keep their metering in their first group for good). The layout-raise entry itself is
// older (fsmlayout.RaiseClusterVersion), and the leader's entry check only
// sees group 0's servers: a build of that older version accepts a raise
// and creates the groups, but neither serves them without a restart nor
// moves a partition into them, and a node outside group 0 would be given
// new groups it cannot take part in. So the raise waits for the whole
// rolling upgrade. Every node checks before forwarding, so a raise sent to
// an upgraded node is refused even while group 0's leader still runs the
// older build (which has no such check). A member that left is not counted.
func (s *Server) raiseGate(n int) error {
	if s.vers.skipGate.Load() {
		return nil
	}
	if lagging := s.membersBelow(partmove.MeteringClusterVersion); len(lagging) > 0 {
		return status.Errorf(codes.FailedPrecondition, "raise groups to %d: %s; moving partitions online needs cluster version %d on every member: finish the rolling upgrade first",
			n, strings.Join(lagging, ", "), partmove.MeteringClusterVersion)
	}
	return nil
}

// membersBelow names each member that has not left and supports a cluster
// version below version (as VersionLag words it).
func (s *Server) membersBelow(version int) []string {
	ms := s.memberList()
	servers := make([]raft.Server, 0, len(ms))
	for _, m := range ms {
		if m.Status != membership.StatusLeft {
			servers = append(servers, raft.Server{ID: raft.ServerID(m.ID)})
		}
	}
	return cluster.VersionLag(servers, ms, s.recordedVersion, s.cfg.Node.ID, s.cfg.Cluster.MaxClusterVersion, version)
}

// raiseGroups raises the cluster's group count to n on group 0's leader
// (Admin.RaiseGroups).
func (s *Server) raiseGroups(ctx context.Context, n int) (*api.RaiseGroupsResponse, error) {
	if err := s.raiseGate(n); err != nil {
		return nil, err
	}
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
// each before serving it).
func (s *Server) RaftGroups() int { return s.host.Groups() }
