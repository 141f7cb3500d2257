package nodeport

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/forward"
)

// Pool caches one gRPC client connection per peer address. A connection is
// dialled lazily and reconnects by itself, so an entry is never evicted; the
// pool lives as long as the node.
type Pool struct {
	creds grpc.DialOption // TLS to peers when the node serves TLS
	// token, when set, authenticates the node's own calls to peers (those
	// not made on a caller's behalf).
	token string
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPool returns a pool dialling with creds (nil: plaintext) whose own
// calls carry token ("" when the cluster has no credentials).
func NewPool(creds grpc.DialOption, token string) *Pool {
	return &Pool{creds: creds, token: token}
}

// Conn returns the cached connection to addr, creating it on first use.
func (p *Pool) Conn(addr string) (*grpc.ClientConn, error) {
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

// Leader returns a connection to group g's leader, as leaderOf names it, and
// the context to call it with: forward.Outgoing(ctx) (the forwarded mark and
// the caller's credential), plus the node's token when the call carries no
// credential of a caller, i.e. the node calls for itself. It refuses with
// Unavailable when ctx was itself forwarded (a call is passed on at most
// once, so two nodes that disagree on the leader cannot bounce it) or when no
// other node is known to lead g.
func (p *Pool) Leader(ctx context.Context, self string, g int, leaderOf func(g int) (id, addr string)) (*grpc.ClientConn, context.Context, error) {
	id, addr := leaderOf(g)
	if forward.Was(ctx) || id == "" || id == self || addr == "" {
		return nil, nil, status.Errorf(codes.Unavailable, "group %d: no leader reachable from %s at the moment; retry", g, self)
	}
	return p.Forward(ctx, addr)
}

// Forward is Leader for a given node: a connection to addr and the context
// to pass the call on with (the forwarded mark, the caller's credential, or
// the node's token when the node calls for itself). For calls that must
// reach one node (a group's new leader, the node an operator named).
func (p *Pool) Forward(ctx context.Context, addr string) (*grpc.ClientConn, context.Context, error) {
	cc, err := p.Conn(addr)
	if err != nil {
		return nil, nil, err
	}
	out := forward.Outgoing(ctx)
	if md, _ := metadata.FromOutgoingContext(out); len(md.Get("authorization")) == 0 && p.token != "" {
		out = metadata.AppendToOutgoingContext(out, "authorization", "Bearer "+p.token)
	}
	return cc, out, nil
}

// own adds the node's token to a call the node makes on its own behalf. A
// forwarded call keeps exactly what Leader gave it.
func (p *Pool) own(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get("authorization")) > 0 || forward.IsOutgoing(ctx) {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token)
}

func (p *Pool) ownUnary(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, co ...grpc.CallOption) error {
	return inv(p.own(ctx), m, req, reply, cc, co...)
}

func (p *Pool) ownStream(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, st grpc.Streamer, co ...grpc.CallOption) (grpc.ClientStream, error) {
	return st(p.own(ctx), d, cc, m, co...)
}

// Close closes every pooled connection; a later Conn dials afresh.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
