package server

import (
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TLSConfig holds ready-made TLS configurations for every channel of a node
// (package tlsutil builds them from certificate files). A nil field leaves its
// channel in plaintext.
type TLSConfig struct {
	// GRPC is the server side of the gRPC listener (Tracker and Admin API).
	GRPC *tls.Config
	// HTTP is the server side of the HTTP listener (metrics, health, UI).
	HTTP *tls.Config
	// Peer is the client side used when this node calls another node's gRPC
	// API (admin forwarding, reads forwarded to a replica). Required with
	// GRPC: every node of a cluster serves the same way, so a node that serves
	// TLS must also dial TLS, with a certificate if client auth is required.
	Peer *tls.Config
	// RaftServer and RaftClient are mutual TLS on the raft port (both or
	// neither; see raftnode.Config).
	RaftServer, RaftClient *tls.Config
	// GossipKeys encrypt serf gossip (membership.Config.Keys).
	GossipKeys [][]byte
}

func (c *TLSConfig) validate() error {
	if c.GRPC != nil && c.Peer == nil {
		return errors.New("config: Access.TLS.GRPC is set but Access.TLS.Peer is not: nodes call each other's gRPC API and must dial with TLS too")
	}
	if (c.RaftServer == nil) != (c.RaftClient == nil) {
		return errors.New("config: Access.TLS.RaftServer and Access.TLS.RaftClient must be set together")
	}
	return nil
}

// grpcCreds is the gRPC listener's transport: TLS when TLS.GRPC is set.
func (s *Server) grpcCreds() grpc.ServerOption {
	if s.cfg.Access.TLS.GRPC == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(credentials.NewTLS(s.cfg.Access.TLS.GRPC))
}

// peerCredentials are the transport credentials of calls to other nodes. The
// server name is taken from each peer's advertised address, so node
// certificates must hold those names or IPs.
func (s *Server) peerCredentials() grpc.DialOption {
	if s.cfg.Access.TLS.Peer == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(s.cfg.Access.TLS.Peer))
}

// serveHTTP serves plain HTTP, or HTTPS when TLS.HTTP is set.
func (s *Server) serveHTTP(lis net.Listener) error {
	if s.cfg.Access.TLS.HTTP == nil {
		return s.http.Serve(lis)
	}
	s.http.TLSConfig = s.cfg.Access.TLS.HTTP.Clone()
	return s.http.ServeTLS(lis, "", "")
}

// HTTPScheme is "https" when the HTTP listener serves TLS, else "http".
func (s *Server) HTTPScheme() string {
	if s.cfg.Access.TLS.HTTP != nil {
		return "https"
	}
	return "http"
}
