package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/nodeport"
)

// Nodes authenticate to each other as nodes (docs/access-control.md, "Node
// credentials"): never with the admin token, never with a client's
// credential. The cluster key comes from the gossip keyring (every key, the
// first signing, so a rotation keeps working); a cluster started with
// --insecure-cluster and no keyring derives it from the admin token, which
// is then never sent anywhere either. From the cluster key come one key for
// node-to-node gRPC (nodeport.Keys) and one for the raft connection header
// (raftnode.Config.ClusterKeys).

// clusterKeys returns the cluster keys of cfg for purpose ("grpc", "raft"),
// nil when the cluster has none (no gossip key and no admin token).
func clusterKeys(cfg Config, purpose string) [][]byte {
	var base [][]byte
	switch {
	case len(cfg.TLS.GossipKeys) > 0:
		for _, k := range cfg.TLS.GossipKeys {
			base = append(base, hmacOf(k, "tollgate cluster key v1"))
		}
	case cfg.AdminToken != "":
		sum := sha256.Sum256([]byte(cfg.AdminToken))
		base = append(base, hmacOf(sum[:], "tollgate cluster key v1 from the admin token"))
	}
	var out [][]byte
	for _, b := range base {
		out = append(out, hmacOf(b, "tollgate "+purpose+" key"))
	}
	return out
}

// RaftClusterKeys are the keys cfg's node authenticates raft connection
// headers with (raftnode.MuxConfig.ClusterKeys), for tools and tests that
// speak raft as a node of the cluster.
func RaftClusterKeys(cfg Config) [][]byte { return clusterKeys(cfg, "raft") }

func hmacOf(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// insecureClusterError is why a multi-node node with credentials refuses to
// start without a gossip key or TLS.
var errInsecureCluster = errors.New("config: this node joins a multi-node cluster (gossip on) with credentials (admin token or credentials file) but neither a gossip key nor TLS: " +
	"any process that reaches the gossip port could then pose as a node. Fix: give every node the same gossip key " +
	"(`tollgate tls gossip-key > gossip.key`, then --gossip-keyring-file gossip.key, or TOLLGATE_GOSSIP_KEY), or serve TLS with node certificates " +
	"(--tls-cert/--tls-key/--tls-ca, see docs/tls.md); on a network no stranger can reach, --insecure-cluster starts it anyway")

// clusterSecured reports whether nodes can tell nodes from strangers
// without the insecure flag: a gossip keyring, or TLS with node
// certificates on gRPC and raft.
func (c *Config) clusterSecured() bool {
	return len(c.TLS.GossipKeys) > 0 || (c.TLS.GRPC != nil && c.TLS.RaftServer != nil)
}

// multiNode: the node takes part in a cluster of several nodes (gossip on
// and not a --dev single node that joins nobody).
func (c *Config) multiNode() bool {
	return c.GossipAddr != "" && (!c.Bootstrap || len(c.Join) > 0)
}

// nodeCallKey marks the context of a call verified to come from a node of
// this cluster on its own account.
type nodeCallKey struct{}

// isNodeCall reports whether ctx serves a node's own call (node credential
// or node certificate, not forwarded for a caller).
func isNodeCall(ctx context.Context) bool {
	v, _ := ctx.Value(nodeCallKey{}).(bool)
	return v
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
	if s.cfg.GRPCAdvertise != "" {
		return s.cfg.GRPCAdvertise
	}
	return advertiseOf(s.grpcLis.Addr())
}

// nodeCaller checks an incoming call for a node's credential. node: a node
// of this cluster sent it (node credential, or a node certificate on TLS);
// caller: the principal it was forwarded for ("" for the node's own call).
// A call that names a forwarded caller without a node's credential is
// refused: only a node may assert another's identity.
func (s *Server) nodeCaller(ctx context.Context, method string) (node bool, caller string, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	caller = forward.ForwardedCaller(ctx)
	if v := md.Get(nodeport.NodeAuthKey); len(v) > 0 {
		if s.nodeKeys == nil {
			return false, "", status.Errorf(codes.Unauthenticated, "%s: a node credential, but this node has no cluster key (no gossip key, no admin token)", method)
		}
		if _, err := s.nodeKeys.Verify(v[0], s.nodeTargets(), method, caller); err != nil {
			return false, "", status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
		}
		return true, caller, nil
	}
	if hasNodeCert(ctx) {
		// A verified TLS node certificate is a node credential too.
		return true, caller, nil
	}
	if caller != "" {
		return false, "", status.Errorf(codes.Unauthenticated, "%s: metadata %q names a forwarded caller, which only a node of this cluster may assert", method, nodeport.CallerKey)
	}
	return false, "", nil
}

// hasNodeCert reports whether the call's peer presented a verified node
// certificate (URI SAN tollgate://node/<name>).
func hasNodeCert(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return false
	}
	for _, u := range ti.State.VerifiedChains[0][0].URIs {
		if u.Scheme == "tollgate" && u.Host == "node" {
			return true
		}
	}
	return false
}

// answerChallenge proves to a peer asking (nodeport.Pool.Prove) that this
// node belongs to the cluster; a node without a key answers nothing.
func (s *Server) answerChallenge(ctx context.Context) {
	if s.nodeKeys == nil {
		return
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(nodeport.ChallengeKey); len(v) == 1 && len(v[0]) <= 64 {
		_ = grpc.SetHeader(ctx, metadata.Pairs(nodeport.ProofKey, s.nodeKeys.Prove(v[0], s.grpcAdvertise())))
	}
}

// trusted reports whether member m proved it is a node of this cluster: in
// a cluster with a gossip key every member did (gossip is encrypted and
// authenticated with it); otherwise m answered a challenge at its gossiped
// gRPC address, or this node's raft configurations list it (a leader added
// it, which needs the same proof). Without any cluster key there is nothing
// to prove with and every member counts, as in a cluster without
// credentials.
func (s *Server) trusted(m membership.Member) bool {
	if m.ID == s.cfg.NodeID || s.nodeKeys == nil || len(s.cfg.TLS.GossipKeys) > 0 || s.peers == nil {
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
	if s.nodeKeys == nil || len(s.cfg.TLS.GossipKeys) > 0 || s.peers == nil || !s.proving.CompareAndSwap(false, true) {
		return
	}
	var todo []membership.Member
	for _, m := range ms {
		if m.ID != s.cfg.NodeID && m.Status == membership.StatusAlive && m.GRPCAddr != "" {
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
	if s.nodeKeys == nil || len(s.cfg.TLS.GossipKeys) > 0 || time.Since(s.knownAt) < 2*time.Second {
		return
	}
	s.knownAt = time.Now() // cluster loop only
	known := map[string]string{}
	for g := range s.cfg.Groups {
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
	if !s.cfg.InsecureCluster || !s.cfg.multiNode() || s.cfg.clusterSecured() {
		return ""
	}
	return "--insecure-cluster: no gossip key and no TLS; gossip, raft and gRPC are plaintext. Add --gossip-keyring-file (or TLS) before this network is shared."
}
