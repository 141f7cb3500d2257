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
	// only nodes fill it (about 55 bytes each: 230 MB at the bound). Each
	// nonce is kept 2×CredentialWindow, so the bound is reached at a
	// sustained 17,000 node calls a second into one node; an earlier bound
	// of 2^20 refused node calls from 4,400 a second on.
	maxSeen = 1 << 22
)

// Keys signs and verifies node credentials. nil Keys: the cluster has no key
// and nodes send no credential (a cluster without credentials).
type Keys struct {
	nodeID string
	keys   [][]byte // keys[0] signs, all verify (rotation)
	now    func() time.Time

	mu sync.Mutex
	// The replay cache: the nonces accepted and not yet expired, and the
	// same nonces by the second they expire in, so that a sweep costs what
	// it removes. (It used to scan the whole cache on every call once the
	// cache was half full: at 2,600 node calls a second a node spent 90 %
	// of its CPU in that scan after 200 s of load, and the load fell
	// fortyfold.)
	seen    map[[16]byte]struct{}
	expiry  map[int64][][16]byte // unix second → nonces that expire in it
	swept   int64                // every second before this one is swept
	maxSeen int
}

// NewKeys returns the signer of nodeID over keys, or nil with no key.
func NewKeys(nodeID string, keys [][]byte) *Keys {
	if len(keys) == 0 {
		return nil
	}
	return &Keys{nodeID: nodeID, keys: keys, now: time.Now, seen: map[[16]byte]struct{}{}, expiry: map[int64][][16]byte{}, maxSeen: maxSeen}
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
	var n [16]byte
	if _, err := hex.Decode(n[:], []byte(f[2])); err != nil {
		return "", fmt.Errorf("%w: malformed nonce", ErrBadCredential)
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
	nowS := now / 1000
	k.sweep(nowS)
	if _, dup := k.seen[n]; dup {
		return "", fmt.Errorf("%w: replayed", ErrBadCredential)
	}
	if len(k.seen) >= k.maxSeen {
		return "", fmt.Errorf("%w: too many credentials in the replay window", ErrBadCredential)
	}
	// Kept until 2×CredentialWindow after its time, not one: a credential
	// is refused by time once this node's clock is a window past it, and
	// the second window covers this clock stepping back by up to one.
	// A nonce that would expire in a second already swept (this clock
	// stepped back further) goes in the next sweep's: by then its time is
	// far outside the window.
	exp := max((ts+2*CredentialWindow.Milliseconds())/1000+1, k.swept)
	k.seen[n] = struct{}{}
	k.expiry[exp] = append(k.expiry[exp], n)
	return f[4], nil
}

// sweep forgets the nonces that expire before second nowS. It visits each
// second once (or, after a jump of the clock longer than the cache has
// seconds, each second in the cache), so its cost is that of what it
// removes. k.mu is held.
func (k *Keys) sweep(nowS int64) {
	if nowS <= k.swept {
		return
	}
	drop := func(s int64) {
		for _, n := range k.expiry[s] {
			delete(k.seen, n)
		}
		delete(k.expiry, s)
	}
	if nowS-k.swept > int64(len(k.expiry)) {
		for s := range k.expiry {
			if s < nowS {
				drop(s)
			}
		}
	} else {
		for s := k.swept; s < nowS; s++ {
			drop(s)
		}
	}
	k.swept = nowS
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
