package server

import (
	"context"
	"crypto/subtle"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// adminPrefix is the full-method prefix of every Admin RPC; only those need
// authorising: the Tracker API carries no token.
const adminPrefix = "/tollgate.v1.Admin/"

// authorizeAdmin checks one call against the admin token: a method outside the
// Admin service passes; with a token configured the call must carry
// "authorization: Bearer <token>"; without one only loopback peers pass, so a
// node started without a token is not an open door on the network.
func authorizeAdmin(ctx context.Context, method, token string) error {
	if !strings.HasPrefix(method, adminPrefix) {
		return nil
	}
	if token == "" {
		p, ok := peer.FromContext(ctx)
		if ok {
			if tcp, ok := p.Addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
				return nil
			}
		}
		return status.Error(codes.PermissionDenied, "admin API: no admin token is configured on this node, so only loopback clients may use it; start the server with --admin-token")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		// Constant time: the comparison must not tell a prober how many
		// leading bytes it guessed right.
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "admin API: missing or wrong token (metadata \"authorization: Bearer <token>\"; the CLI reads --token or TOLLGATE_ADMIN_TOKEN)")
}

// authorize checks the admin token (or, without one, that the peer is on loopback).
func (s *Server) authorize(ctx context.Context, method string) error {
	return authorizeAdmin(ctx, method, s.cfg.AdminToken)
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}
