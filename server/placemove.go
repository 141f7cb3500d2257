package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/nodeid"
)

// Draining (tollgate node drain): a node marked decommissioned keeps that
// mark in its data dir and gossips it; leaders then move its replicas away
// (package cluster, move.go).

// decommissionFile, in the data dir, records that the node was drained, so
// that a restart keeps its replicas off it until the drain is undone.
const decommissionFile = "DECOMMISSIONED"

// decommissioned reports whether this node's data dir carries the drain mark.
func (s *Server) decommissioned() bool {
	_, err := os.Stat(filepath.Join(s.cfg.Node.DataDir, decommissionFile))
	return err == nil
}

// setDecommissioned records (or clears) the drain mark, then gossips it.
func (s *Server) setDecommissioned(on bool) error {
	if s.members == nil {
		return status.Error(codes.FailedPrecondition, "drain: this node runs without gossip (single node): there is nowhere to move its replicas")
	}
	path := filepath.Join(s.cfg.Node.DataDir, decommissionFile)
	if on {
		if err := nodeid.WriteFileDurable(path, []byte("drained by tollgate node drain; remove with tollgate node drain --undo\n")); err != nil { // identity.go
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
	if req.NodeId == s.cfg.Node.ID {
		if err := s.setDecommissioned(!req.Undo); err != nil {
			return nil, err
		}
		return &api.DrainNodeResponse{NodeId: req.NodeId, Decommissioning: !req.Undo}, nil
	}
	if forward.Was(ctx) {
		return nil, status.Errorf(codes.FailedPrecondition, "drain: forwarded to this node (%s) for %q: the membership views disagree; retry", s.cfg.Node.ID, req.NodeId)
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
