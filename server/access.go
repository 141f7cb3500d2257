package server

import (
	"context"
	"net"

	"github.com/tollgate-io/tollgate/access"
)

// The node's access check is package access; this file is its glue: the
// Guard built from this node's credentials, keys and addresses, and the
// names the capability files use to apply the admin rule themselves.

// newGuard is the node's access check (after creds and nodeKeys are set).
func (s *Server) newGuard() *access.Guard {
	return &access.Guard{Creds: s.creds, AdminToken: s.cfg.Access.AdminToken, NodeKeys: s.nodeKeys,
		Targets: s.nodeTargets, Advertise: s.grpcAdvertise}
}

const (
	adminNotLoopback = access.AdminNotLoopback
	adminBadToken    = access.AdminBadToken
)

// adminVerdictFor is the admin rule for checks inside handlers
// (access.Guard.AdminVerdictFor).
func (s *Server) adminVerdictFor(remote net.IP, authorization []string) access.AdminVerdict {
	return s.guard.AdminVerdictFor(remote, authorization)
}

// callerIsNode says whether a call's caller may speak for a node of the
// cluster (access.Guard.CallerIsNode).
func (s *Server) callerIsNode(ctx context.Context) bool { return s.guard.CallerIsNode(ctx) }

func isNodeCall(ctx context.Context) bool { return access.IsNodeCall(ctx) }

func clientOfCtx(ctx context.Context) string { return access.ClientOf(ctx) }
