package server

import (
	"time"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/membership"
)

// Node credentials are defined in package access (nodeauth.go there);
// this file holds what needs the node: its keys from its config, its
// addresses, and which gossip members proved they are nodes.

// clusterKeys returns the cluster keys of cfg for purpose ("grpc", "raft"),
// nil when the cluster has none (no gossip key and no admin token).
func clusterKeys(cfg Config, purpose string) [][]byte {
	return access.ClusterKeys(cfg.Access.TLS.GossipKeys, cfg.Access.AdminToken, purpose)
}

// RaftClusterKeys are the keys cfg's node authenticates raft connection
// headers with (raftnode.MuxConfig.ClusterKeys), for tools and tests that
// speak raft as a node of the cluster.
func RaftClusterKeys(cfg Config) [][]byte { return clusterKeys(cfg, "raft") }

// clusterSecured reports whether nodes can tell nodes from strangers
// without the insecure flag: a gossip keyring, or TLS with node
// certificates on gRPC and raft.
func (c *Config) clusterSecured() bool {
	return len(c.Access.TLS.GossipKeys) > 0 || (c.Access.TLS.GRPC != nil && c.Access.TLS.RaftServer != nil)
}

// multiNode: the node takes part in a cluster of several nodes (gossip on
// and not a --dev single node that joins nobody).
func (c *Config) multiNode() bool {
	return c.Gossip.Addr != "" && (!c.Cluster.Bootstrap || len(c.Gossip.Join) > 0)
}

// nodeTargets are the addresses callers may have dialled to reach this
// node's gRPC API: the advertised one (what gossip spreads) and the
// listener's.
func (s *Server) nodeTargets() []string {
	out := []string{s.grpcAdvertise()}
	if a := s.grpcLis.Addr().String(); a != out[0] {
		out = append(out, a)
	}
	return out
}

// grpcAdvertise is the gRPC address this node gossips.
func (s *Server) grpcAdvertise() string {
	if s.cfg.Node.GRPCAdvertise != "" {
		return s.cfg.Node.GRPCAdvertise
	}
	return advertiseOf(s.grpcLis.Addr())
}

// trusted reports whether member m proved it is a node of this cluster: in
// a cluster with a gossip key every member did (gossip is encrypted and
// authenticated with it); otherwise m answered a challenge at its gossiped
// gRPC address, or this node's raft configurations list it (a leader added
// it, which needs the same proof). Without any cluster key there is nothing
// to prove with and every member counts, as in a cluster without
// credentials.
func (s *Server) trusted(m membership.Member) bool {
	if m.ID == s.cfg.Node.ID || s.nodeKeys == nil || len(s.cfg.Access.TLS.GossipKeys) > 0 || s.peers == nil {
		return true
	}
	if id, ok := s.peers.Identified(m.GRPCAddr); ok && id == m.ID {
		return true
	}
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	return m.RaftAddr != "" && s.known[m.ID] == m.RaftAddr
}

// proveMembers asks every member not yet proven to prove itself, in the
// background, at most one round at a time. Members that fail stay out of
// the member list (memberList) until they prove themselves.
func (s *Server) proveMembers(ms []membership.Member) {
	if s.nodeKeys == nil || len(s.cfg.Access.TLS.GossipKeys) > 0 || s.peers == nil || !s.proving.CompareAndSwap(false, true) {
		return
	}
	var todo []membership.Member
	for _, m := range ms {
		if m.ID != s.cfg.Node.ID && m.Status == membership.StatusAlive && m.GRPCAddr != "" {
			if id, ok := s.peers.Proven(m.GRPCAddr); !ok || id != m.ID {
				todo = append(todo, m)
			}
		}
	}
	if len(todo) == 0 {
		s.proving.Store(false)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.proving.Store(false)
		ctx, cancel := s.untilClosing()
		defer cancel()
		for _, m := range todo {
			id, err := s.peers.Prove(ctx, m.GRPCAddr)
			switch {
			case err != nil:
				s.logIncarnationOnce(-1, m.ID, "gossip member has not proved it is a node of this cluster: it gets no credential, no replica and no place in the cluster view", "member", m.ID, "grpc", m.GRPCAddr, "err", err)
			case id != m.ID:
				s.logIncarnationOnce(-1, m.ID, "gossip member's gRPC address is another node's: ignored", "member", m.ID, "grpc", m.GRPCAddr, "proved_as", id)
			}
		}
	}()
}

// noteKnown records the servers (id and raft address) of the raft
// configurations this node holds: a leader admitted them, which needs the
// same proof.
func (s *Server) noteKnown() {
	if s.nodeKeys == nil || len(s.cfg.Access.TLS.GossipKeys) > 0 || time.Since(s.knownAt) < 2*time.Second {
		return
	}
	s.knownAt = time.Now() // cluster loop only
	known := map[string]string{}
	for g := range s.host.Groups() {
		fut := s.host.Raft(g).GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		for _, srv := range fut.Configuration().Servers {
			known[string(srv.ID)] = string(srv.Address)
		}
	}
	s.knownMu.Lock()
	s.known = known
	s.knownMu.Unlock()
}

// InsecureCluster says why this node runs as an insecure cluster
// (--insecure-cluster: multi-node, credentials, neither a gossip key nor
// TLS), "" when it does not; the ready banner prints it.
func (s *Server) InsecureCluster() string {
	if !s.cfg.Access.InsecureCluster || !s.cfg.multiNode() || s.cfg.clusterSecured() {
		return ""
	}
	return "--insecure-cluster: no gossip key and no TLS; gossip, raft and gRPC are plaintext. Add --gossip-keyring-file (or TLS) before this network is shared."
}
