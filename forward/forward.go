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

// authKey is the gRPC metadata key of a caller's credentials ("Bearer …").
const authKey = "authorization"

// httpCallerKey carries a REST caller's Authorization header values in a
// request context, so a call forwarded on its behalf carries them as a gRPC
// caller's metadata would be.
type httpCallerKey struct{}

// FromHTTP is r's context with the REST caller's credentials attached, for
// calls this node may forward on the caller's behalf.
func FromHTTP(r *http.Request) context.Context {
	if auth := r.Header.Values("Authorization"); len(auth) > 0 {
		return context.WithValue(r.Context(), httpCallerKey{}, auth)
	}
	return r.Context()
}

// Outgoing is the outgoing context of a call this node makes on its caller's
// behalf: marked as forwarded and carrying exactly the caller's credentials
// (the gRPC caller's "authorization" metadata, or a REST caller's
// Authorization header attached by FromHTTP; nothing for an anonymous
// caller). Any other incoming metadata stays behind.
func Outgoing(ctx context.Context) context.Context {
	out := metadata.Pairs(Header, "1")
	md, _ := metadata.FromIncomingContext(ctx)
	if auth := md.Get(authKey); len(auth) > 0 {
		out.Set(authKey, auth...)
	} else if auth, ok := ctx.Value(httpCallerKey{}).([]string); ok {
		out.Set(authKey, auth...)
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// Own is the context for work a node does on its own account while serving
// a call, such as group 0's leader copying a change into the other groups:
// the deadline and cancellation of the call remain, its metadata (the
// forwarded mark, the caller's credentials) stays behind, so the work may be
// forwarded and runs with the node's own rights.
func Own(ctx context.Context) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.MD{})
}

// Was reports whether another node already forwarded this incoming call.
func Was(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(Header)) > 0
}

// IsOutgoing reports whether an outgoing context is a forwarded call (the
// node's own credentials must then not be added to it).
func IsOutgoing(ctx context.Context) bool {
	md, _ := metadata.FromOutgoingContext(ctx)
	return len(md.Get(Header)) > 0
}
