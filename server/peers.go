package server

import (
	"context"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
)

// This file holds the pool of client connections a node uses to pass a call on
// to another node (package forward owns the metadata of a forwarded call).

// peerPool caches one gRPC client connection per peer address. A connection
// is dialled lazily and reconnects by itself, so an entry is never evicted;
// the pool lives as long as the node.
type peerPool struct {
	creds grpc.DialOption // TLS to peers when the node serves TLS (tls.go)
	// token, when set, authenticates the node's own calls to peers (those
	// not made on a caller's behalf) while credentials are configured.
	token string
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// conn returns the cached connection to addr, creating it on first use (admin
// forwarding, reads forwarded to a replica).
func (p *peerPool) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc := p.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := p.creds
	if creds == nil {
		creds = grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	opts := []grpc.DialOption{creds}
	if p.token != "" {
		opts = append(opts, grpc.WithChainUnaryInterceptor(p.ownUnary), grpc.WithChainStreamInterceptor(p.ownStream))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dial %s: %v", addr, err)
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[addr] = cc
	return cc, nil
}

// own adds the node's token to a call the node makes on its own behalf. A
// forwarded call keeps exactly its caller's credentials (none for an
// anonymous caller): the node never lends its own to a caller.
func (p *peerPool) own(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get("authorization")) > 0 || forward.IsOutgoing(ctx) {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token)
}

func (p *peerPool) ownUnary(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, co ...grpc.CallOption) error {
	return inv(p.own(ctx), m, req, reply, cc, co...)
}

func (p *peerPool) ownStream(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, st grpc.Streamer, co ...grpc.CallOption) (grpc.ClientStream, error) {
	return st(p.own(ctx), d, cc, m, co...)
}

// client returns an Admin client over the pooled connection to addr.
func (p *peerPool) client(addr string) (api.AdminClient, error) {
	cc, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return api.NewAdminClient(cc), nil
}

// close closes every pooled connection; a later conn dials afresh.
func (p *peerPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// leaderClient returns nil when this node leads g, else a client for the
// leader (or an error when there is none or the call was already forwarded).
func (a *adminService) leaderClient(ctx context.Context, g int) (api.AdminClient, error) {
	s := a.s
	if s.host.Raft(g).State() == raft.Leader {
		return nil, nil
	}
	id, addr := s.leaderOf(g)
	if forward.Was(ctx) || id == "" || id == s.cfg.NodeID || addr == "" {
		return nil, status.Errorf(codes.Unavailable, "group %d: no leader reachable from %s at the moment; retry", g, s.cfg.NodeID)
	}
	return a.client(addr)
}
