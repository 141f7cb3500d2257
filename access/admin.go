package access

import (
	"context"
	"crypto/subtle"
	"net"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// adminPrefix is the full-method prefix of every Admin RPC; those, the
// Config service's (configPrefix) and the admin methods of other services
// need authorising without a credentials file: the Tracker API carries no
// token.
const (
	adminPrefix  = "/tollgate.v1.Admin/"
	configPrefix = "/tollgate.v1.Config/"
)

// IsAdminMethod says whether a full gRPC method name is under the admin
// rule. Metering.SetClock changes the node's metering clock (test mode):
// the rest of the Metering service is the public event API.
func IsAdminMethod(method string) bool {
	return strings.HasPrefix(method, adminPrefix) || strings.HasPrefix(method, configPrefix) ||
		method == api.Metering_SetClock_FullMethodName
}

// AdminVerdict is the outcome of the admin rule, shared by the gRPC Admin
// service, the HTTP debug endpoints and the handlers that check it
// themselves (Guard.AdminVerdictFor).
type AdminVerdict int

const (
	AdminAllowed     AdminVerdict = iota
	AdminNotLoopback              // no token configured and the peer is not on loopback
	AdminBadToken                 // a token is configured and the call did not carry it
)

// CheckAdmin is the admin rule: with a token configured, one of the
// authorization values must be "Bearer <token>"; without one only loopback
// peers pass, so a node started without a token is not an open door on the
// network. remote is nil when the peer's address is unknown.
func CheckAdmin(remote net.IP, authorization []string, token string) AdminVerdict {
	if token == "" {
		if remote != nil && remote.IsLoopback() {
			return AdminAllowed
		}
		return AdminNotLoopback
	}
	for _, v := range authorization {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		// Constant time: the comparison must not tell a prober how many
		// leading bytes it guessed right.
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			return AdminAllowed
		}
	}
	return AdminBadToken
}

// AuthorizeAdmin applies CheckAdmin to one gRPC call; methods that are not
// admin methods (IsAdminMethod) pass.
func AuthorizeAdmin(ctx context.Context, method, token string) error {
	if !IsAdminMethod(method) {
		return nil
	}
	var remote net.IP
	if p, ok := peer.FromContext(ctx); ok {
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			remote = tcp.IP
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	switch CheckAdmin(remote, md.Get("authorization"), token) {
	case AdminNotLoopback:
		return status.Error(codes.PermissionDenied, "admin API: no admin token is configured on this node, so only loopback clients may use it; start the server with --admin-token-file")
	case AdminBadToken:
		return status.Error(codes.Unauthenticated, "admin API: missing or wrong token (metadata \"authorization: Bearer <token>\"; the CLI reads --token or TOLLGATE_ADMIN_TOKEN)")
	}
	return nil
}
