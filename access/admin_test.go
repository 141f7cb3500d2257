package access

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestAdminAuthorize(t *testing.T) {
	const method = adminPrefix + "ListPeers"
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	remote := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5000}
	ctxFrom := func(addr net.Addr, auth ...string) context.Context {
		ctx := context.Background()
		if addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
		}
		if len(auth) > 0 {
			md := metadata.MD{}
			md.Append("authorization", auth...)
			ctx = metadata.NewIncomingContext(ctx, md)
		}
		return ctx
	}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		method string
		token  string
		want   codes.Code
	}{
		{"tracker call needs nothing", ctxFrom(remote), "/tollgate.v1.Tracker/TrackSeries", "tok", codes.OK},
		{"no token, loopback peer", ctxFrom(loopback), method, "", codes.OK},
		{"no token, IPv6 loopback peer", ctxFrom(&net.TCPAddr{IP: net.IPv6loopback}), method, "", codes.OK},
		{"no token, remote peer", ctxFrom(remote), method, "", codes.PermissionDenied},
		{"no token, no peer", ctxFrom(nil), method, "", codes.PermissionDenied},
		{"no token, unix socket peer", ctxFrom(&net.UnixAddr{Name: "/tmp/x", Net: "unix"}), method, "", codes.PermissionDenied},
		{"no token, remote peer sending one anyway", ctxFrom(remote, "Bearer tok"), method, "", codes.PermissionDenied},
		{"right token", ctxFrom(remote, "Bearer tok"), method, "tok", codes.OK},
		{"right token among others", ctxFrom(remote, "Bearer nope", "Bearer tok"), method, "tok", codes.OK},
		{"wrong token", ctxFrom(remote, "Bearer tok2"), method, "tok", codes.Unauthenticated},
		{"token prefix only", ctxFrom(remote, "Bearer to"), method, "tok", codes.Unauthenticated},
		{"token without Bearer", ctxFrom(remote, "tok"), method, "tok", codes.Unauthenticated},
		{"basic scheme", ctxFrom(remote, "Basic tok"), method, "tok", codes.Unauthenticated},
		{"no metadata, loopback does not bypass a token", ctxFrom(loopback), method, "tok", codes.Unauthenticated},
		{"config service", ctxFrom(remote), "/tollgate.v1.Config/SetLimits", "tok", codes.Unauthenticated},
		{"metering clock is admin", ctxFrom(remote, "Bearer nope"), "/tollgate.v1.Metering/SetClock", "tok", codes.Unauthenticated},
		{"metering clock, right token", ctxFrom(remote, "Bearer tok"), "/tollgate.v1.Metering/SetClock", "tok", codes.OK},
		{"metering clock, no token, remote", ctxFrom(remote), "/tollgate.v1.Metering/SetClock", "", codes.PermissionDenied},
		{"metering events need nothing", ctxFrom(remote), "/tollgate.v1.Metering/Start", "tok", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := AuthorizeAdmin(tc.ctx, tc.method, tc.token)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("AuthorizeAdmin: %v (code %v), want %v", err, got, tc.want)
			}
		})
	}
}
