package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
)

// Elastic placement. PlaceAll (placement.go) says where every group's voters
// belong given the members; planMoves (plan.go) picks one step towards it
// for the groups a node leads; this file runs those steps. A move adds the
// new node through the learner path (learner.go: non-voter, caught up,
// promoted) and only then removes the old voter, so a group has one voter
// more, never one fewer, while it moves. Each leader runs one move at a time
// and starts the next no sooner than MoveInterval after the last: a move
// ships a snapshot of the group to the new node, and moves from every leader
// at once would take the bandwidth tracking needs.

// decommissionFile, in the data dir, records that the node was drained, so
// that a restart keeps its replicas off it until the drain is undone.
const decommissionFile = "DECOMMISSIONED"

// moveState is a node's replica-move bookkeeping.
type moveState struct {
	busy atomic.Bool // a move runs (one at a time per node)
	next time.Time   // no new move before (cluster loop only)
}

// moveInput gathers planMoves' snapshot: every member, every group led here
// with its configuration.
func (s *Server) moveInput() moveInput {
	in := moveInput{Self: s.cfg.NodeID, Groups: s.cfg.Groups, Replicas: s.cfg.Replicas, Members: s.memberList()}
	for _, lc := range s.ledConfigs() {
		in.Led = append(in.Led, groupConfig{Group: lc.group, Servers: lc.conf.Servers})
	}
	return in
}

// maybeMove starts at most one move when none runs here and the interval
// since the last one has passed; it also refreshes the misplaced gauge.
func (s *Server) maybeMove(now time.Time) {
	if s.cfg.MoveInterval < 0 || s.cfg.DisableAutoPlace || s.members == nil {
		return
	}
	in := s.moveInput()
	s.metrics.misplaced.Set(float64(misplacedReplicas(in)))
	if s.moves.busy.Load() || now.Before(s.moves.next) {
		return
	}
	mv, ok := planMoves(in)
	if !ok {
		return
	}
	s.moves.next = now.Add(s.cfg.MoveInterval)
	if mv.Transfer != nil {
		s.log.Info("handing off leadership to move this node's replica", "group", mv.Group, "to", mv.Transfer.ID, "reason", mv.Reason)
		s.metrics.moves.WithLabelValues("handoff").Inc()
		s.moveLeader(leaderMove{Group: mv.Group, To: *mv.Transfer})
		return
	}
	s.moves.busy.Store(true)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.moves.busy.Store(false)
		ctx, cancel := s.untilClosing()
		defer cancel()
		start := time.Now()
		if err := s.runMove(ctx, mv); err != nil {
			s.metrics.moves.WithLabelValues("failed").Inc()
			s.log.Warn("replica move failed; placement retries it", "group", mv.Group, "add", mv.Add.ID, "remove", mv.Remove, "reason", mv.Reason, "err", err)
			return
		}
		s.metrics.moves.WithLabelValues("done").Inc()
		s.log.Info("replica moved", "group", mv.Group, "add", mv.Add.ID, "remove", mv.Remove, "reason", mv.Reason, "took", time.Since(start).Round(time.Millisecond))
	}()
}

// runMove executes one placementMove on the group led here: the new voter
// first (when there is one), then the removal, each only while this node
// still leads and the configuration still calls for it.
func (s *Server) runMove(ctx context.Context, mv placementMove) error {
	g := mv.Group
	if mv.Add.ID != "" {
		if _, err := s.addLearner(ctx, learnerRequest{
			Group: g, ID: mv.Add.ID, Addr: mv.Add.RaftAddr,
			Force:   true, // the zone keeps its count: the old voter goes next
			CatchUp: autoCatchUp, Reason: mv.Reason,
		}); err != nil {
			return fmt.Errorf("add %s: %w", mv.Add.ID, err)
		}
	}
	r := s.host.Raft(g)
	if r.State() != raft.Leader {
		return errors.New("leadership moved before the old voter was removed; the next leader removes it")
	}
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	voters := 0
	present := false
	for _, srv := range fut.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters++
			present = present || string(srv.ID) == mv.Remove
		}
	}
	if !present {
		return nil // removed already (an earlier attempt, or the operator)
	}
	if voters <= s.cfg.Replicas {
		return fmt.Errorf("not removing %s: the group has %d voters, not more than its %d", mv.Remove, voters, s.cfg.Replicas)
	}
	if err := r.RemoveServer(raft.ServerID(mv.Remove), 0, membershipTimeout).Error(); err != nil {
		return fmt.Errorf("remove %s: %w", mv.Remove, err)
	}
	return nil
}

// misplacedReplicas counts the voters of the groups led here that placement
// wants on another node.
func misplacedReplicas(in moveInput) int {
	targets := PlaceAll(in.Groups, placementCandidates(in.Members), in.Replicas)
	n := 0
	for _, gc := range in.Led {
		if gc.Group >= len(targets) {
			continue
		}
		for _, srv := range gc.Servers {
			if srv.Suffrage == raft.Voter && !slices.ContainsFunc(targets[gc.Group], func(m membership.Member) bool { return m.ID == string(srv.ID) }) {
				n++
			}
		}
	}
	return n
}

// decommissioned reports whether this node's data dir carries the drain mark.
func (s *Server) decommissioned() bool {
	_, err := os.Stat(filepath.Join(s.cfg.DataDir, decommissionFile))
	return err == nil
}

// setDecommissioned records (or clears) the drain mark, then gossips it.
func (s *Server) setDecommissioned(on bool) error {
	if s.members == nil {
		return status.Error(codes.FailedPrecondition, "drain: this node runs without gossip (single node): there is nowhere to move its replicas")
	}
	path := filepath.Join(s.cfg.DataDir, decommissionFile)
	if on {
		if err := writeFileDurable(path, []byte("drained by tollgate node drain; remove with tollgate node drain --undo\n")); err != nil { // identity.go
			return status.Errorf(codes.Internal, "drain: record the mark: %v", err)
		}
	} else if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return status.Errorf(codes.Internal, "drain: clear the mark: %v", err)
	}
	if err := s.members.SetDecommissioning(on); err != nil {
		return status.Errorf(codes.Internal, "drain: gossip the mark: %v", err)
	}
	s.log.Info("decommission mark changed", "decommissioning", on)
	return nil
}

// DrainNode marks the named node decommissioned (or eligible again): on that
// node, which the receiving node forwards to.
func (a *adminService) DrainNode(ctx context.Context, req *api.DrainNodeRequest) (*api.DrainNodeResponse, error) {
	if req.NodeId == "" {
		return nil, status.Error(codes.InvalidArgument, "drain: node_id is required")
	}
	s := a.s
	if req.NodeId == s.cfg.NodeID {
		if err := s.setDecommissioned(!req.Undo); err != nil {
			return nil, err
		}
		return &api.DrainNodeResponse{NodeId: req.NodeId, Decommissioning: !req.Undo}, nil
	}
	if forward.Was(ctx) {
		return nil, status.Errorf(codes.FailedPrecondition, "drain: forwarded to this node (%s) for %q: the membership views disagree; retry", s.cfg.NodeID, req.NodeId)
	}
	var target *membership.Member
	for _, m := range s.memberList() {
		if m.ID == req.NodeId {
			target = &m
		}
	}
	switch {
	case target == nil:
		return nil, status.Errorf(codes.NotFound, "drain: %q is not a member of the cluster", req.NodeId)
	case target.Status != membership.StatusAlive:
		return nil, status.Errorf(codes.FailedPrecondition, "drain: %q is %s: it records the mark itself, so it must be running (to take a dead node's replicas away, remove it from each group: tollgate raft remove-server)", req.NodeId, target.Status)
	}
	cc, fctx, err := s.peers.Forward(ctx, target.GRPCAddr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "drain: dial %s at %s: %v", req.NodeId, target.GRPCAddr, err)
	}
	return api.NewAdminClient(cc).DrainNode(fctx, req)
}

// placementStatus fills resp.Placement from the leaders' reports in
// resp.Nodes and the view's members.
func placementStatus(resp *api.StatusResponse, groups, replicas int) {
	var ms []membership.Member
	for _, m := range resp.GetView().GetMembers() {
		ms = append(ms, membership.Member{ID: m.Id, Zone: m.Zone, Status: m.Status, Decommissioning: m.Decommissioning})
	}
	targets := PlaceAll(groups, placementCandidates(ms), replicas)
	leaders := map[uint32]*api.GroupState{} // a deposed leader may still say so: the newest term wins
	for _, n := range resp.Nodes {
		for _, gs := range n.Groups {
			if gs.RaftState != raft.Leader.String() || int(gs.Group) >= len(targets) {
				continue
			}
			if cur, ok := leaders[gs.Group]; !ok || gs.Term > cur.Term {
				leaders[gs.Group] = gs
			}
		}
	}
	for g := range uint32(groups) {
		gs, ok := leaders[g]
		if !ok {
			continue
		}
		gp := &api.GroupPlacement{Group: g, Voters: gs.Voters, Learners: gs.Learners}
		for _, m := range targets[g] {
			gp.Target = append(gp.Target, m.ID)
		}
		slices.Sort(gp.Target)
		resp.Placement = append(resp.Placement, gp)
	}
}
