package nodeport

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
)

// proofTTL is how long an address that proved it is a node is trusted with
// credentials before it is asked again.
const proofTTL = time.Minute

// Pool caches one gRPC client connection per peer address. A connection is
// dialled lazily and reconnects by itself, so an entry is never evicted; the
// pool lives as long as the node.
type Pool struct {
	creds grpc.DialOption // TLS to peers when the node serves TLS
	// keys, when set, sign every call with a node credential (nodeauth.go),
	// sent only to addresses that proved they are nodes of the cluster.
	keys  *Keys
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn

	proofMu sync.Mutex
	proofs  map[string]proof // address → the node that proved itself there
	failed  map[string]time.Time
	proving map[string]*sync.Mutex
}

// failedTTL: an address that answered without a valid proof is not asked
// again for this long (its calls fail at once), so a stranger is not sent a challenge
// for every call the node would make to it.
const failedTTL = 5 * time.Second

type proof struct {
	id string
	at time.Time
}

// NewPool returns a pool dialling with creds (nil: plaintext) whose calls
// carry node credentials under keys (nil when the cluster has no key: calls
// then carry no credential at all).
func NewPool(creds grpc.DialOption, keys *Keys) *Pool {
	return &Pool{creds: creds, keys: keys, proofs: map[string]proof{}, failed: map[string]time.Time{}, proving: map[string]*sync.Mutex{}}
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
	opts := []grpc.DialOption{creds, grpc.WithChainUnaryInterceptor(p.signUnary), grpc.WithChainStreamInterceptor(p.signStream)}
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
// the caller's verified identity; the pool adds the node credential). It
// refuses with Unavailable when ctx was itself forwarded (a call is passed on
// at most once, so two nodes that disagree on the leader cannot bounce it) or
// when no other node is known to lead g.
func (p *Pool) Leader(ctx context.Context, self string, g int, leaderOf func(g int) (id, addr string)) (*grpc.ClientConn, context.Context, error) {
	id, addr := leaderOf(g)
	if forward.Was(ctx) || id == "" || id == self || addr == "" {
		return nil, nil, status.Errorf(codes.Unavailable, "group %d: no leader reachable from %s at the moment; retry", g, self)
	}
	return p.Forward(ctx, addr)
}

// Forward is Leader for a given node: a connection to addr and the context
// to pass the call on with. For calls that must reach one node (a group's
// new leader, the node an operator named).
func (p *Pool) Forward(ctx context.Context, addr string) (*grpc.ClientConn, context.Context, error) {
	cc, err := p.Conn(addr)
	if err != nil {
		return nil, nil, err
	}
	return cc, forward.Outgoing(ctx), nil
}

// sign replaces whatever credential an outgoing call carries by the node
// credential (and the forwarded caller's identity, which the credential
// covers): the pool never sends an admin token or a client's token to a
// peer. Without keys the call goes out with no credential.
func (p *Pool) sign(ctx context.Context, cc *grpc.ClientConn, method string) (context.Context, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(ChallengeKey)) > 0 {
		return ctx, nil // the proof call itself
	}
	md = md.Copy()
	md.Delete("authorization")
	md.Delete(NodeAuthKey)
	caller := ""
	if c := md.Get(CallerKey); len(c) > 0 {
		caller = c[0]
	}
	if p.keys != nil {
		if _, err := p.Prove(ctx, cc.Target()); err != nil {
			return nil, err
		}
		md.Set(NodeAuthKey, p.keys.Sign(cc.Target(), method, caller))
	}
	return metadata.NewOutgoingContext(ctx, md), nil
}

func (p *Pool) signUnary(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, co ...grpc.CallOption) error {
	ctx, err := p.sign(ctx, cc, m)
	if err != nil {
		return err
	}
	return inv(ctx, m, req, reply, cc, co...)
}

func (p *Pool) signStream(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, st grpc.Streamer, co ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, err := p.sign(ctx, cc, m)
	if err != nil {
		return nil, err
	}
	return st(ctx, d, cc, m, co...)
}

// Proven returns the node id that proved itself at addr within proofTTL.
func (p *Pool) Proven(addr string) (string, bool) {
	p.proofMu.Lock()
	defer p.proofMu.Unlock()
	pr, ok := p.proofs[addr]
	if !ok || time.Since(pr.at) > proofTTL {
		return "", false
	}
	return pr.id, true
}

// Identified returns the node id that last proved itself at addr, however
// long ago, unless the address has since answered without a valid proof:
// who a member is, for the member list, which must not flicker each time a
// proof is renewed.
func (p *Pool) Identified(addr string) (string, bool) {
	p.proofMu.Lock()
	defer p.proofMu.Unlock()
	pr, ok := p.proofs[addr]
	return pr.id, ok
}

// Prove asks addr to prove it is a node of this cluster (unless it did
// within proofTTL) and returns its node id. With no keys nothing can be
// proved and Prove fails.
func (p *Pool) Prove(ctx context.Context, addr string) (string, error) {
	if p.keys == nil {
		return "", status.Error(codes.FailedPrecondition, "this node has no cluster key: peers cannot prove they are nodes")
	}
	if id, ok := p.Proven(addr); ok {
		return id, nil
	}
	p.proofMu.Lock()
	l := p.proving[addr]
	if l == nil {
		l = &sync.Mutex{}
		p.proving[addr] = l
	}
	p.proofMu.Unlock()
	l.Lock() // one proof per address at a time
	defer l.Unlock()
	if id, ok := p.Proven(addr); ok {
		return id, nil
	}
	p.proofMu.Lock()
	at, failed := p.failed[addr]
	p.proofMu.Unlock()
	if failed && time.Since(at) < failedTTL {
		return "", status.Errorf(codes.PermissionDenied, "%s has not proved it is a node of this cluster (retried within %v); no credential was sent to it", addr, failedTTL)
	}
	id, err := p.prove(ctx, addr)
	p.proofMu.Lock()
	switch {
	case status.Code(err) == codes.PermissionDenied:
		// It answered, with no valid proof: a stranger. (An address that
		// did not answer is asked again at the next call.)
		p.failed[addr] = time.Now()
		delete(p.proofs, addr)
	case err == nil:
		delete(p.failed, addr)
		p.proofs[addr] = proof{id: id, at: time.Now()}
	}
	p.proofMu.Unlock()
	return id, err
}

// prove runs one challenge against addr.
func (p *Pool) prove(ctx context.Context, addr string) (string, error) {
	cc, err := p.Conn(addr)
	if err != nil {
		return "", err
	}
	ch := Challenge()
	// Only the challenge: no credential of any kind goes to an address
	// before it proves itself.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		cctx, cancel = context.WithDeadline(cctx, dl)
		defer cancel()
	}
	cctx = metadata.NewOutgoingContext(cctx, metadata.Pairs(ChallengeKey, ch))
	var hdr metadata.MD
	if err := cc.Invoke(cctx, api.Clock_Now_FullMethodName, &api.ClockNowRequest{}, &api.ClockNowResponse{}, grpc.Header(&hdr)); err != nil {
		return "", status.Errorf(codes.Unavailable, "%s: proving it is a node of this cluster: %v", addr, status.Convert(err).Message())
	}
	var answer string
	if v := hdr.Get(ProofKey); len(v) > 0 {
		answer = v[0]
	}
	id, err := p.keys.CheckProof(answer, ch, addr)
	if err != nil {
		return "", status.Errorf(codes.PermissionDenied, "%s did not prove it is a node of this cluster (%v); no credential was sent to it", addr, err)
	}
	return id, nil
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

// String names the pool in logs.
func (p *Pool) String() string { return fmt.Sprintf("nodeport.Pool(%d conns)", len(p.conns)) }
