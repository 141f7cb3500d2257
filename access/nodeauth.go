package access

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/forward"
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

// ClusterKeys returns the cluster keys for purpose ("grpc", "raft") of a
// node with gossipKeys and adminToken; nil when the cluster has none (no
// gossip key and no admin token).
func ClusterKeys(gossipKeys [][]byte, adminToken, purpose string) [][]byte {
	var base [][]byte
	switch {
	case len(gossipKeys) > 0:
		for _, k := range gossipKeys {
			base = append(base, hmacOf(k, "tollgate cluster key v1"))
		}
	case adminToken != "":
		sum := sha256.Sum256([]byte(adminToken))
		base = append(base, hmacOf(sum[:], "tollgate cluster key v1 from the admin token"))
	}
	var out [][]byte
	for _, b := range base {
		out = append(out, hmacOf(b, "tollgate "+purpose+" key"))
	}
	return out
}

func hmacOf(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// ErrInsecureCluster is why a multi-node node with credentials refuses to
// start without a gossip key or TLS.
var ErrInsecureCluster = errors.New("config: this node joins a multi-node cluster (gossip on) with credentials (admin token or credentials file) but neither a gossip key nor TLS: " +
	"any process that reaches the gossip port could then pose as a node. Fix: give every node the same gossip key " +
	"(`tollgate tls gossip-key > gossip.key`, then --gossip-keyring-file gossip.key, or TOLLGATE_GOSSIP_KEY), or serve TLS with node certificates " +
	"(--tls-cert/--tls-key/--tls-ca, see docs/tls.md); on a network no stranger can reach, --insecure-cluster starts it anyway")

// nodeCaller checks an incoming call for a node's credential. node: a node
// of this cluster sent it (node credential, or a node certificate on TLS);
// caller: the principal it was forwarded for ("" for the node's own call).
// A call that names a forwarded caller without a node's credential is
// refused: only a node may assert another's identity.
func (g *Guard) nodeCaller(ctx context.Context, method string) (node bool, caller string, err error) {
	caller = forward.ForwardedCaller(ctx)
	if v := metadata.ValueFromIncomingContext(ctx, nodeport.NodeAuthKey); len(v) > 0 {
		if g.NodeKeys == nil {
			return false, "", status.Errorf(codes.Unauthenticated, "%s: a node credential, but this node has no cluster key (no gossip key, no admin token)", method)
		}
		if _, err := g.NodeKeys.Verify(v[0], g.Targets(), method, caller); err != nil {
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
func (g *Guard) answerChallenge(ctx context.Context) {
	if g.NodeKeys == nil {
		return
	}
	if v := metadata.ValueFromIncomingContext(ctx, nodeport.ChallengeKey); len(v) == 1 && len(v[0]) <= 64 {
		_ = grpc.SetHeader(ctx, metadata.Pairs(nodeport.ProofKey, g.NodeKeys.Prove(v[0], g.Advertise())))
	}
}
