package access

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/nodeport"
	"github.com/tollgate-io/tollgate/tenantscope"
)

// Guard is one node's access check: the gRPC tap handler and interceptors,
// the HTTP route guard and the admin rule for handlers that apply it
// themselves. The node builds one at start and registers its methods.
type Guard struct {
	// Creds are the credentials in force; nil without any credential (no
	// admin token, no credentials file): then only admin methods are
	// checked, by the admin rule.
	Creds      *Store
	AdminToken string
	// NodeKeys verify node credentials (nodeauth.go); nil when the cluster
	// has no key.
	NodeKeys *nodeport.Keys
	// Targets are the addresses callers may have dialled to reach this
	// node's gRPC API (a node credential names one); Advertise is the one
	// the node gossips (a proof names it).
	Targets   func() []string
	Advertise func() string
}

// Tap authenticates a gRPC call from its headers, before gRPC reads any of
// its messages (grpc.InTapHandle): a caller without a credential the
// method needs is refused while the stream is still only headers, so it
// never makes the node allocate for a message (a message's length prefix
// alone once reserved up to the receive limit, about 2 MB, per stream).
// The scope is checked here too; the tenants a request names are checked
// after decoding by the interceptor (authorize) or the handler
// (tenantscope).
func (g *Guard) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	// A node's call (node credential or node certificate) is verified
	// here, before its messages too; the credential's nonce is spent by
	// the check, so authorize takes this verdict from the context instead
	// of verifying again.
	node, caller, err := g.nodeCaller(ctx, info.FullMethodName)
	if err != nil {
		return ctx, err
	}
	if node {
		return context.WithValue(ctx, tapNodeKey{}, caller), nil
	}
	if g.Creds == nil {
		if !IsAdminMethod(info.FullMethodName) {
			return ctx, nil
		}
		return ctx, AuthorizeAdmin(metadata.NewIncomingContext(ctx, info.Header), info.FullMethodName, g.AdminToken)
	}
	r, ok := grpcRules[info.FullMethodName]
	if !ok || r.Scope == "" {
		return ctx, nil // no rule: the interceptor refuses; public: nothing to check
	}
	r.InHandler = true // no tenants yet: the message is not read
	switch v, why, _, _ := g.Creds.check(r, info.Header.Get("authorization"), grpcCertIdentities(ctx), nil); v {
	case unauthorized:
		return ctx, status.Error(codes.Unauthenticated, why)
	case forbidden:
		return ctx, status.Error(codes.PermissionDenied, why)
	}
	return ctx, nil
}

// tapNodeKey carries, from Tap to authorize, the verdict that a call comes
// from a node of the cluster: the caller it forwards for ("" for the
// node's own call).
type tapNodeKey struct{}

// authorize applies the node's rule to one gRPC call: with a credentials
// file, the rule table (rules.go) for the method and the request's tenants
// (req nil for streams); without one, the admin rule (the admin token, or
// loopback peers without one) to admin methods only. A call from a node of
// the cluster (node credential, nodeauth.go) passes as the node when the
// node calls on its own account, and is judged as the caller it names when
// it forwards a caller's call: never with the node's rights. The context
// returned names the caller's principal, for calls forwarded on its behalf.
func (g *Guard) authorize(ctx context.Context, method string, req any) (context.Context, error) {
	var node bool
	var caller string
	if c, ok := ctx.Value(tapNodeKey{}).(string); ok {
		node, caller = true, c // verified before the messages were read (Tap)
	} else {
		var err error
		if node, caller, err = g.nodeCaller(ctx, method); err != nil {
			return ctx, err
		}
	}
	if node && caller == "" {
		// The node's own call: "" keeps it the node's when passed on.
		ctx = context.WithValue(forward.WithCaller(ctx, ""), nodeCallKey{}, true)
		return context.WithValue(ctx, identityKey{}, "node"), nil
	}
	if g.Creds == nil {
		if node {
			// Forwarded by a node that applied the admin rule to its
			// caller (loopback peers only, without a token).
			if IsAdminMethod(method) && caller != forward.CallerLoopback {
				return ctx, status.Errorf(codes.PermissionDenied, "%s: forwarded for a caller the admin rule did not admit", method)
			}
			return forward.WithCaller(ctx, caller), nil
		}
		if err := AuthorizeAdmin(ctx, method, g.AdminToken); err != nil {
			return ctx, err
		}
		p := forward.CallerAnonymous
		if IsAdminMethod(method) {
			p = forward.CallerLoopback
		}
		return forward.WithCaller(ctx, p), nil
	}
	r, ok := grpcRules[method]
	if !ok {
		return ctx, status.Errorf(codes.PermissionDenied, "%s: no access rule; refused while credentials are configured", method)
	}
	var tenants []string
	if req != nil && r.GRPCTenants != nil {
		tenants = r.GRPCTenants(req)
	}
	var presented *credential
	if node {
		presented = g.Creds.byPrincipal(caller) // the caller the forwarding node verified
	} else {
		presented = g.Creds.lookup(metadata.ValueFromIncomingContext(ctx, "authorization"), grpcCertIdentities(ctx))
	}
	v, why, c := g.Creds.checkCred(r, presented, tenants)
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
			// to check, as they arrive (Rule.InHandler).
			ctx = tenantscope.With(ctx, &tenantscope.Scope{Credential: c.name, Tenants: c.tenants})
		}
	}
	return forward.WithCaller(ctx, principal(presented)), nil
}

// AdminVerdictFor is the admin rule for checks inside handlers (HTTP debug
// and clock endpoints, backlog reports, the Shares service): with a
// credentials file, any admin credential; otherwise CheckAdmin.
func (g *Guard) AdminVerdictFor(remote net.IP, authorization []string) AdminVerdict {
	if g.Creds != nil {
		if c := g.Creds.lookup(authorization, nil); c != nil && c.has(ScopeAdmin) {
			return AdminAllowed
		}
		if g.AdminToken == "" {
			return AdminBadToken
		}
	}
	return CheckAdmin(remote, authorization, g.AdminToken)
}

// Unary is the gRPC unary interceptor of the access check.
func (g *Guard) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod == api.Clock_Now_FullMethodName {
		g.answerChallenge(ctx) // a peer asks this node to prove it is a node (nodeauth.go)
	}
	ctx, err := g.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// Stream is the gRPC stream interceptor of the access check; a stream
// opened with a credential ends when a reload revokes or changes it.
func (g *Guard) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := g.authorize(ss.Context(), info.FullMethod, nil)
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
		ctx, untrack = g.Creds.track(ctx, grpcRules[info.FullMethod], md.Get("authorization"), grpcCertIdentities(ctx), forward.ForwardedCaller(ss.Context()), c)
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

// Route applies the rule table (rules.go) to one HTTP route when
// credentials are configured: 401 without a known credential, 403 without
// the route's scope or tenant. It runs after the mux matched the request
// (so it reads the path values the handler reads) and before the handler
// reads the body: a caller without a credential never makes the node read
// or decode a body. Tenants named in a body are the handler's to check
// (Rule.InHandler, tenantscope), on the document it parsed. A route without
// a rule is refused; requests no route matches get the mux's 404/405.
func (g *Guard) Route(pattern string, h http.Handler) http.Handler {
	if g.Creds == nil {
		return h
	}
	rule, ok := httpRules[pattern]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ok {
			refuseHTTP(w, r, http.StatusForbidden, pattern+": no access rule; refused while credentials are configured")
			return
		}
		var tenants []string
		if rule.Scope != "" && rule.HTTPTenants != nil {
			tenants = rule.HTTPTenants(r)
		}
		v, why, c, caller := g.Creds.check(rule, r.Header.Values("Authorization"), certIdentities(r.TLS), tenants)
		switch v {
		case unauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
			refuseHTTP(w, r, http.StatusUnauthorized, why)
			return
		case forbidden:
			refuseHTTP(w, r, http.StatusForbidden, why)
			return
		}
		if c != nil && c.tenants != nil {
			r = r.WithContext(tenantscope.With(r.Context(), &tenantscope.Scope{Credential: c.name, Tenants: c.tenants}))
		}
		// A call forwarded for this request names the caller's principal,
		// never its token (forward.Outgoing).
		h.ServeHTTP(w, r.WithContext(forward.WithCaller(r.Context(), caller)))
	})
}

// refuseHTTP answers a refused request without reading its body for the
// handler: when one may follow, the connection is closed after the answer,
// and the server drains what the client is still sending (at most 256 KiB,
// so a client that sends its whole request before reading gets the answer,
// not a broken pipe) for at most refusedDrain, not the read timeout: a slow
// body the node will never use holds the connection a second at most.
func refuseHTTP(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refusedDrain))
	}
	httpjson.WriteError(w, code, msg)
}

// refusedDrain bounds how long a refused request's body is drained.
const refusedDrain = time.Second

// CallerIsNode says whether the caller of a gRPC call may speak for a node
// of the cluster (a peer's sketch push naming its origin): a call verified
// as a node's own (node credential or node certificate, nodeauth.go);
// without credentials every caller is trusted alike, so a claim costs
// nothing it could not do anyway. An operator's admin credential is not a
// node.
func (g *Guard) CallerIsNode(ctx context.Context) bool {
	return g.Creds == nil || IsNodeCall(ctx)
}

// credentialKey carries the credential a call was authorized with.
type credentialKey struct{}

// identityKey carries the caller's credential identity in a call's context.
type identityKey struct{}

// nodeCallKey marks the context of a call verified to come from a node of
// this cluster on its own account.
type nodeCallKey struct{}

// IsNodeCall reports whether ctx serves a node's own call (node credential
// or node certificate, not forwarded for a caller).
func IsNodeCall(ctx context.Context) bool {
	v, _ := ctx.Value(nodeCallKey{}).(bool)
	return v
}

// ClientOf names the caller of a call for per-client bounds: its
// credential's identity when it presented one (set by the access check),
// else its IP address.
func ClientOf(ctx context.Context) string {
	if id, ok := ctx.Value(identityKey{}).(string); ok && id != "" {
		return id
	}
	if p, ok := peer.FromContext(ctx); ok {
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			return tcp.IP.String()
		}
		return p.Addr.String()
	}
	return "unknown"
}

// ctxStream is a server stream with a derived context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }
