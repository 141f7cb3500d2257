package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/tenantscope"
)

// adminPrefix is the full-method prefix of every Admin RPC; those, the
// Config service's (configPrefix) and the admin methods of other services
// (adminMethods) need authorising: the Tracker API carries no token.
const (
	adminPrefix  = "/tollgate.v1.Admin/"
	configPrefix = "/tollgate.v1.Config/"
)

// isAdminMethod says whether a full gRPC method name is under the admin rule.
// Metering.SetClock changes the node's metering clock (test mode): the rest
// of the Metering service is the public event API.
func isAdminMethod(method string) bool {
	return strings.HasPrefix(method, adminPrefix) || strings.HasPrefix(method, configPrefix) ||
		method == api.Metering_SetClock_FullMethodName
}

// adminVerdict is the outcome of the admin rule, shared by the gRPC Admin
// service and the HTTP debug endpoints.
type adminVerdict int

const (
	adminAllowed     adminVerdict = iota
	adminNotLoopback              // no token configured and the peer is not on loopback
	adminBadToken                 // a token is configured and the call did not carry it
)

// checkAdmin is the admin rule: with a token configured, one of the
// authorization values must be "Bearer <token>"; without one only loopback
// peers pass, so a node started without a token is not an open door on the
// network. remote is nil when the peer's address is unknown.
func checkAdmin(remote net.IP, authorization []string, token string) adminVerdict {
	if token == "" {
		if remote != nil && remote.IsLoopback() {
			return adminAllowed
		}
		return adminNotLoopback
	}
	for _, v := range authorization {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		// Constant time: the comparison must not tell a prober how many
		// leading bytes it guessed right.
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			return adminAllowed
		}
	}
	return adminBadToken
}

// authorizeAdmin applies checkAdmin to one gRPC call; methods that are not
// admin methods (isAdminMethod) pass.
func authorizeAdmin(ctx context.Context, method, token string) error {
	if !isAdminMethod(method) {
		return nil
	}
	var remote net.IP
	if p, ok := peer.FromContext(ctx); ok {
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			remote = tcp.IP
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	switch checkAdmin(remote, md.Get("authorization"), token) {
	case adminNotLoopback:
		return status.Error(codes.PermissionDenied, "admin API: no admin token is configured on this node, so only loopback clients may use it; start the server with --admin-token-file")
	case adminBadToken:
		return status.Error(codes.Unauthenticated, "admin API: missing or wrong token (metadata \"authorization: Bearer <token>\"; the CLI reads --token or TOLLGATE_ADMIN_TOKEN)")
	}
	return nil
}

// authorize applies the node's rule to one gRPC call: with a credentials
// file, the rule table (rules.go) for the method and the request's tenants
// (req nil for streams); without one, the admin rule (the admin token, or
// loopback peers without one) to admin methods only. A call from a node of
// the cluster (node credential, nodeauth.go) passes as the node when the
// node calls on its own account, and is judged as the caller it names when
// it forwards a caller's call: never with the node's rights. The context
// returned names the caller's principal, for calls forwarded on its behalf.
func (s *Server) authorize(ctx context.Context, method string, req any) (context.Context, error) {
	var node bool
	var caller string
	if c, ok := ctx.Value(tapNodeKey{}).(string); ok {
		node, caller = true, c // verified before the messages were read (tapAuth)
	} else {
		var err error
		if node, caller, err = s.nodeCaller(ctx, method); err != nil {
			return ctx, err
		}
	}
	if node && caller == "" {
		// The node's own call: "" keeps it the node's when passed on.
		ctx = context.WithValue(forward.WithCaller(ctx, ""), nodeCallKey{}, true)
		return context.WithValue(ctx, identityKey{}, "node"), nil
	}
	if s.creds == nil {
		if node {
			// Forwarded by a node that applied the admin rule to its
			// caller (loopback peers only, without a token).
			if isAdminMethod(method) && caller != forward.CallerLoopback {
				return ctx, status.Errorf(codes.PermissionDenied, "%s: forwarded for a caller the admin rule did not admit", method)
			}
			return forward.WithCaller(ctx, caller), nil
		}
		if err := authorizeAdmin(ctx, method, s.cfg.AdminToken); err != nil {
			return ctx, err
		}
		p := forward.CallerAnonymous
		if isAdminMethod(method) {
			p = forward.CallerLoopback
		}
		return forward.WithCaller(ctx, p), nil
	}
	r, ok := grpcRules[method]
	if !ok {
		return ctx, status.Errorf(codes.PermissionDenied, "%s: no access rule; refused while credentials are configured", method)
	}
	var tenants []string
	if req != nil && r.grpcTenants != nil {
		tenants = r.grpcTenants(req)
	}
	var presented *credential
	if node {
		presented = s.creds.byPrincipal(caller) // the caller the forwarding node verified
	} else {
		md, _ := metadata.FromIncomingContext(ctx)
		presented = s.creds.lookup(md.Get("authorization"), grpcCertIdentities(ctx))
	}
	v, why, c := s.creds.checkCred(r, presented, tenants)
	switch v {
	case unauthorized:
		return ctx, status.Error(codes.Unauthenticated, why)
	case forbidden:
		return ctx, status.Error(codes.PermissionDenied, why)
	}
	if c != nil {
		ctx = context.WithValue(ctx, identityKey{}, "credential "+c.name) // the per-client stream bound counts by credential
		ctx = context.WithValue(ctx, credentialKey{}, c)
		if c.tenants != nil {
			// Tenants named inside a stream's messages are the handler's
			// to check, as they arrive (rule.inHandler).
			ctx = tenantscope.With(ctx, &tenantscope.Scope{Credential: c.name, Tenants: c.tenants})
		}
	}
	return forward.WithCaller(ctx, principal(presented)), nil
}

// adminVerdictFor is the admin rule for checks inside handlers (HTTP debug
// and clock endpoints, backlog reports, the Shares service): with a
// credentials file, any admin credential; otherwise checkAdmin.
func (s *Server) adminVerdictFor(remote net.IP, authorization []string) adminVerdict {
	if s.creds != nil {
		if c := s.creds.lookup(authorization, nil); c != nil && c.has(ScopeAdmin) {
			return adminAllowed
		}
		if s.cfg.AdminToken == "" {
			return adminBadToken
		}
	}
	return checkAdmin(remote, authorization, s.cfg.AdminToken)
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod == api.Clock_Now_FullMethodName {
		s.answerChallenge(ctx) // a peer asks this node to prove it is a node (nodeauth.go)
	}
	ctx, err := s.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.authorize(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	if c, ok := ctx.Value(credentialKey{}).(*credential); ok && c != nil {
		// A stream lives on after its credential is revoked unless a
		// reload ends it: the handler sees its context end, and the
		// client Unauthenticated naming why.
		md, _ := metadata.FromIncomingContext(ctx)
		var untrack func()
		// A stream a node forwarded (authorize verified the node) is judged
		// again as the caller it names, not by the node's metadata.
		ctx, untrack = s.creds.track(ctx, grpcRules[info.FullMethod], md.Get("authorization"), grpcCertIdentities(ctx), forward.ForwardedCaller(ss.Context()), c)
		defer untrack()
	}
	if ctx != ss.Context() {
		ss = &ctxStream{ServerStream: ss, ctx: ctx}
	}
	err = h(srv, ss)
	if errors.Is(context.Cause(ctx), errRevoked) {
		return status.Errorf(codes.Unauthenticated, "%s: %v; reconnect with a valid credential", info.FullMethod, errRevoked)
	}
	return err
}

// credentialKey carries the credential a call was authorized with.
type credentialKey struct{}

// callerIsNode says whether the caller of a gRPC call may speak for a node
// of the cluster (a peer's sketch push naming its origin): a call verified
// as a node's own (node credential or node certificate, nodeauth.go);
// without credentials every caller is trusted alike, so a claim costs
// nothing it could not do anyway. An operator's admin credential is not a
// node.
func (s *Server) callerIsNode(ctx context.Context) bool {
	return s.creds == nil || isNodeCall(ctx)
}

// ctxStream is a server stream with a derived context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }
