package server

import (
	"context"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/nodeport"
)

// The node's connections to its peers are one nodeport.Pool (s.peers),
// created with the gRPC server; package forward owns the metadata of a
// forwarded call and nodeport.Pool.Leader the way a call reaches a group's
// leader.

// peerPool is the admin service's view of the node's pool.
type peerPool struct{ p *nodeport.Pool }

// conn returns the node's connection to addr.
func (pp peerPool) conn(addr string) (*grpc.ClientConn, error) { return pp.p.Conn(addr) }

// client returns an Admin client over the node's connection to addr.
func (pp peerPool) client(addr string) (api.AdminClient, error) {
	cc, err := pp.p.Conn(addr)
	if err != nil {
		return nil, err
	}
	return api.NewAdminClient(cc), nil
}

// close closes every pooled connection.
func (pp peerPool) close() { pp.p.Close() }

// leaderClient returns nil when this node leads g, else a client for the
// leader and the context to call it with (nodeport.Pool.Leader: forwarded at
// most once, with the caller's credential).
func (a *adminService) leaderClient(ctx context.Context, g int) (api.AdminClient, context.Context, error) {
	s := a.s
	if s.host.Raft(g).State() == raft.Leader {
		return nil, ctx, nil
	}
	cc, fctx, err := s.peers.Leader(ctx, s.cfg.Node.ID, g, s.leaderOf)
	if err != nil {
		return nil, nil, err
	}
	return api.NewAdminClient(cc), fctx, nil
}
