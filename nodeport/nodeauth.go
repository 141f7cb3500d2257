package nodeport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/forward"
)

// Node credentials. A node proves to another node that it belongs to the
// cluster with a MAC under the cluster key (derived from the gossip keyring,
// server.NodeKeys), never with the admin token or a client's credential: a
// peer that is not a node must learn nothing it could use elsewhere.
//
// Every call the pool makes carries NodeAuthKey:
//
//	v1 <unix ms> <nonce hex> <mac hex> <node id>
//
// where the MAC covers the node id, time, nonce, the address dialled (the
// target), the full method and the caller the call is forwarded for
// (CallerKey, "" for the node's own calls). So a credential is good for one
// method on one node for a few minutes and once (the receiver remembers the
// nonces it accepted): a captured credential cannot be replayed elsewhere,
// or at all.
//
// Before the pool sends a credential to an address it asks that address to
// prove it is a node of the cluster (ChallengeKey on a Clock.Now call, answered
// with ProofKey: a MAC of the challenge and the address). An address that
// does not prove it — a stranger that joined plaintext gossip and advertises
// a gRPC listener — receives a random challenge and nothing else.
const (
	NodeAuthKey  = "x-tollgate-node-auth"
	CallerKey    = forward.CallerKey
	ChallengeKey = "x-tollgate-node-challenge"
	ProofKey     = "x-tollgate-node-proof"

	// CredentialWindow is how far a credential's time may be from the
	// receiver's clock; nodes within the cluster's clock bound are far
	// inside it.
	CredentialWindow = 2 * time.Minute
	// maxSeen bounds the replay cache: only valid credentials enter it, so
	// only nodes fill it (about 100 bytes each).
	maxSeen = 1 << 20
)

// Keys signs and verifies node credentials. nil Keys: the cluster has no key
// and nodes send no credential (a cluster without credentials).
type Keys struct {
	nodeID string
	keys   [][]byte // keys[0] signs, all verify (rotation)
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]int64 // nonce → expiry (unix ms)
}

// NewKeys returns the signer of nodeID over keys, or nil with no key.
func NewKeys(nodeID string, keys [][]byte) *Keys {
	if len(keys) == 0 {
		return nil
	}
	return &Keys{nodeID: nodeID, keys: keys, now: time.Now, seen: map[string]int64{}}
}

// NodeID is the id this node signs as.
func (k *Keys) NodeID() string { return k.nodeID }

func mac(key []byte, parts ...string) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

func nonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Sign returns a credential for one call of method on target, forwarded for
// caller ("" for the node's own call).
func (k *Keys) Sign(target, method, caller string) string {
	ts := strconv.FormatInt(k.now().UnixMilli(), 10)
	n := nonce()
	m := mac(k.keys[0], "tollgate-node-auth-v1", k.nodeID, ts, n, target, method, caller)
	return "v1 " + ts + " " + n + " " + hex.EncodeToString(m) + " " + k.nodeID
}

// ErrBadCredential wraps every refusal of a node credential.
var ErrBadCredential = errors.New("not a valid node credential of this cluster")

// Verify checks a credential received for method by this node, which is
// reachable at targets, forwarded for caller; it returns the signing node's
// id. A credential is accepted once.
func (k *Keys) Verify(cred string, targets []string, method, caller string) (string, error) {
	f := strings.SplitN(cred, " ", 5)
	if len(f) != 5 || f[0] != "v1" || len(f[2]) != 32 || f[4] == "" {
		return "", fmt.Errorf("%w: malformed", ErrBadCredential)
	}
	ts, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed time", ErrBadCredential)
	}
	now := k.now().UnixMilli()
	if d := now - ts; d > CredentialWindow.Milliseconds() || d < -CredentialWindow.Milliseconds() {
		return "", fmt.Errorf("%w: its time is %v from this node's clock (at most %v)", ErrBadCredential, time.Duration(d)*time.Millisecond, CredentialWindow)
	}
	got, err := hex.DecodeString(f[3])
	if err != nil {
		return "", fmt.Errorf("%w: malformed MAC", ErrBadCredential)
	}
	ok := false
	for _, key := range k.keys {
		for _, t := range targets {
			if hmac.Equal(got, mac(key, "tollgate-node-auth-v1", f[4], f[1], f[2], t, method, caller)) {
				ok = true
			}
		}
	}
	if !ok {
		return "", fmt.Errorf("%w: wrong MAC (another cluster's key, another target or method, or altered)", ErrBadCredential)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, dup := k.seen[f[2]]; dup {
		return "", fmt.Errorf("%w: replayed", ErrBadCredential)
	}
	if len(k.seen) >= maxSeen/2 {
		for n, exp := range k.seen {
			if exp < now {
				delete(k.seen, n)
			}
		}
		if len(k.seen) >= maxSeen {
			return "", fmt.Errorf("%w: too many credentials in the replay window", ErrBadCredential)
		}
	}
	k.seen[f[2]] = ts + 2*CredentialWindow.Milliseconds()
	return f[4], nil
}

// Challenge returns a fresh challenge for an address to prove itself.
func Challenge() string { return nonce() }

// Prove answers challenge as this node, reachable at target (its advertised
// gRPC address).
func (k *Keys) Prove(challenge, target string) string {
	return k.nodeID + " " + hex.EncodeToString(mac(k.keys[0], "tollgate-node-proof-v1", challenge, target, k.nodeID))
}

// CheckProof verifies the answer to challenge from the node dialled at
// target and returns its node id.
func (k *Keys) CheckProof(proof, challenge, target string) (string, error) {
	id, m, ok := strings.Cut(proof, " ")
	if !ok || id == "" {
		return "", fmt.Errorf("%w: no proof", ErrBadCredential)
	}
	// The id may hold spaces; the MAC never does.
	if i := strings.LastIndexByte(proof, ' '); i > 0 {
		id, m = proof[:i], proof[i+1:]
	}
	got, err := hex.DecodeString(m)
	if err != nil {
		return "", fmt.Errorf("%w: malformed proof", ErrBadCredential)
	}
	for _, key := range k.keys {
		if hmac.Equal(got, mac(key, "tollgate-node-proof-v1", challenge, target, id)) {
			return id, nil
		}
	}
	return "", fmt.Errorf("%w: wrong proof", ErrBadCredential)
}
