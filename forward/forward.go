package forward

import (
	"context"
	"net/http"

	"google.golang.org/grpc/metadata"
)

// Header marks a call that one node forwarded to another. A node that
// receives a call carrying it answers itself or fails retryably; it never
// forwards again.
const Header = "x-tollgate-forwarded"

// CallerKey is the metadata key of the caller a call is forwarded for
// (nodeport.CallerKey: the node credential covers it, so only a node may
// assert it).
const CallerKey = "x-tollgate-caller"

// Caller principals besides credential names ("cred:<name>").
const (
	// CallerAnonymous: the caller presented no credential.
	CallerAnonymous = "anonymous"
	// CallerAdminToken: the caller presented the admin token.
	CallerAdminToken = "admin-token"
	// CallerLoopback: a cluster without credentials admitted an admin call
	// from a loopback peer.
	CallerLoopback = "loopback"
)

// callerCtxKey holds the verified principal of the caller a node serves.
type callerCtxKey struct{}

// WithCaller is ctx carrying the verified principal of the caller the node
// serves (set by the node's access check); "" marks the node's own work.
func WithCaller(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, callerCtxKey{}, principal)
}

// Caller is the principal WithCaller attached; "" for the node's own work.
func Caller(ctx context.Context) string {
	p, _ := ctx.Value(callerCtxKey{}).(string)
	return p
}

// FromHTTP is r's context, for calls this node may forward on the REST
// caller's behalf: the access check attached the caller's principal to it.
func FromHTTP(r *http.Request) context.Context { return r.Context() }

// Outgoing is the outgoing context of a call this node makes on its caller's
// behalf: marked as forwarded and naming the caller's verified principal
// (Caller), never the caller's token; the receiving node applies that
// principal's scope. The node's own work (no principal) names none, and the
// receiving node sees the node. Any other incoming metadata stays behind.
func Outgoing(ctx context.Context) context.Context {
	out := metadata.Pairs(Header, "1")
	if p := Caller(ctx); p != "" {
		out.Set(CallerKey, p)
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// ForwardedCaller is the principal an incoming forwarded call names ("" when
// none: a node's own call).
func ForwardedCaller(ctx context.Context) string {
	// ValueFromIncomingContext reads the key in place: FromIncomingContext
	// copies the whole metadata map, and this runs on every call.
	if v := metadata.ValueFromIncomingContext(ctx, CallerKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Own is the context for work a node does on its own account while serving
// a call, such as group 0's leader copying a change into the other groups:
// the deadline and cancellation of the call remain, its metadata (the
// forwarded mark, the caller's credentials) stays behind, so the work may be
// forwarded and runs with the node's own rights.
func Own(ctx context.Context) context.Context {
	return WithCaller(metadata.NewIncomingContext(ctx, metadata.MD{}), "")
}

// Was reports whether another node already forwarded this incoming call.
func Was(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, Header)) > 0
}

// IsOutgoing reports whether an outgoing context is a forwarded call (the
// node's own credentials must then not be added to it).
func IsOutgoing(ctx context.Context) bool {
	md, _ := metadata.FromOutgoingContext(ctx)
	return len(md.Get(Header)) > 0
}
