package raftnode

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Node incarnations on the wire.
//
// A node's data dir carries an incarnation id, created with the data dir
// (server/identity.go). The raft address of a server in a group's
// configuration names the incarnation it was added as: "host:port#<16 hex>".
// Dialing such an address sends the incarnation (and this node's cluster id)
// in the connection header; the listener refuses a connection that names an
// incarnation other than its own. So a node whose data dir was replaced (a new
// incarnation under the same node id) never answers a RequestVote,
// AppendEntries or TimeoutNow meant for its earlier self: it cannot vote as
// that server or count towards a quorum in its place, whoever still lists it.
// Only a configuration change that names the new incarnation (the old one
// removed, the new one added) lets it take part again.
//
// An address without "#..." (written by an earlier build, or given by hand)
// names no incarnation; it is sent with the version-1 header, which earlier
// builds understand, and accepted only by a node whose identity was adopted
// from an earlier build's data dir (Identity.AcceptUnnamed).

// incarnationSep separates the dialable endpoint from the incarnation in a
// raft server address.
const incarnationSep = "#"

// IDLen is the length in hex digits of a cluster id and of an incarnation.
const IDLen = 16

// WithIncarnation returns the raft server address of endpoint ("host:port")
// as incarnation inc; endpoint alone when inc is "".
func WithIncarnation(endpoint, inc string) string {
	if inc == "" {
		return endpoint
	}
	return endpoint + incarnationSep + inc
}

// SplitIncarnation splits a raft server address into the endpoint to dial and
// the incarnation it names ("" for none).
func SplitIncarnation(addr string) (endpoint, inc string) {
	endpoint, inc, _ = strings.Cut(addr, incarnationSep)
	return endpoint, inc
}

// ValidID checks a cluster id or incarnation: IDLen lower-case hex digits,
// not all zero (zero means "none" on the wire).
func ValidID(id string) error {
	b, err := hex.DecodeString(id)
	if err != nil || len(id) != IDLen || strings.ToLower(id) != id {
		return fmt.Errorf("%q is not %d lower-case hex digits", id, IDLen)
	}
	for _, c := range b {
		if c != 0 {
			return nil
		}
	}
	return fmt.Errorf("%q is zero", id)
}

func idBytes(id string) [IDLen / 2]byte {
	var out [IDLen / 2]byte
	if id != "" {
		_, _ = hex.Decode(out[:], []byte(id))
	}
	return out
}

func idString(b []byte) string {
	for _, c := range b {
		if c != 0 {
			return hex.EncodeToString(b)
		}
	}
	return ""
}

// Identity is what the raft listener checks connections against.
type Identity struct {
	// Incarnation of this node's data dir (IDLen hex digits). "" turns the
	// checks off (library users, tests): every connection is accepted.
	Incarnation string
	// ClusterID is the cluster this data dir belongs to, "" while unknown
	// (a new node before it learns the cluster's id); see Host.SetClusterID.
	ClusterID string
	// AcceptUnnamed accepts connections that name no incarnation (addresses
	// written by an earlier build). Set for an identity adopted from such a
	// data dir: the configurations listing this node's plain address mean
	// this very data.
	AcceptUnnamed bool
	// OnRefused, if set, is called (from the accepting goroutine, so it must
	// not block) for every connection refused because it was meant for
	// another incarnation of this node ("" when it named none) or came from
	// another cluster (cluster set).
	OnRefused func(group int, named, cluster string)
}

// identityState is the Mux's live copy of its Identity.
type identityState struct {
	mu      sync.Mutex
	id      Identity
	lastLog map[string]time.Time // rate limit of refusal warnings
}

func (s *identityState) get() Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

func (s *identityState) setClusterID(id string) {
	s.mu.Lock()
	s.id.ClusterID = id
	s.mu.Unlock()
}

// shouldLog reports whether a refusal of this kind was not logged in the
// last 10 s (peers redial every few hundred ms while they list us).
func (s *identityState) shouldLog(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastLog == nil {
		s.lastLog = map[string]time.Time{}
	}
	if time.Since(s.lastLog[key]) < 10*time.Second {
		return false
	}
	s.lastLog[key] = time.Now()
	return true
}

// check decides whether a connection naming incarnation named (and coming
// from cluster) may be served; "" means yes, else why not.
func (s *identityState) check(group int, named, cluster string) string {
	id := s.get()
	if id.Incarnation == "" {
		return ""
	}
	var why string
	switch {
	case cluster != "" && id.ClusterID != "" && cluster != id.ClusterID:
		why = fmt.Sprintf("the peer belongs to cluster %s, this node to cluster %s", cluster, id.ClusterID)
		named = ""
	case named == "" && !id.AcceptUnnamed:
		why = fmt.Sprintf("the connection names no incarnation (its address has no \"#<incarnation>\": written by an earlier build, or given by hand) and this data dir is incarnation %s, created by this build, so it cannot be what that address meant",
			id.Incarnation)
		cluster = ""
	case named != "" && named != id.Incarnation:
		why = fmt.Sprintf("the connection is for incarnation %s of this node, this data dir is a new incarnation %s (it was replaced or wiped): it takes no part in group %d until a leader removes the earlier incarnation and adds this one",
			named, id.Incarnation, group)
		cluster = ""
	default:
		return ""
	}
	if id.OnRefused != nil {
		id.OnRefused(group, named, cluster)
	}
	return why
}

// SetClusterID records the cluster id once this node learns it (it joined a
// cluster, or bootstrapped one): from then on, connections from another
// cluster are refused. Empty ids are ignored.
func (h *Host) SetClusterID(id string) {
	if id != "" {
		h.mux.ident.setClusterID(id)
	}
}
