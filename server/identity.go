package server

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/raftnode"
)

// Node identity. A data dir records, in identity.json, the node id it was
// created for, the id of the cluster it belongs to, and an incarnation: a
// random id created with the data dir. A node whose disk is replaced comes
// back under the same node id with a new incarnation, and the raft transport
// refuses every connection meant for the earlier one (raftnode/identity.go):
// it cannot vote as its former self or count towards a quorum in its place.
// A group leader replaces the earlier incarnation with the new one
// (cluster/incarnation.go); until then the node reports why it takes no part.

const identityFile = "identity.json"

// identityVersion versions identity.json.
const identityVersion = 1

// nodeIdentity is identity.json.
type nodeIdentity struct {
	Version     int    `json:"version"`
	NodeID      string `json:"node_id"`
	ClusterID   string `json:"cluster_id,omitempty"` // "" until the node bootstraps or joins a cluster
	Incarnation string `json:"incarnation"`
	// Adopted: the data dir was written by an earlier build (no identity.json
	// next to its raft state); configurations listing this node's plain raft
	// address mean this data.
	Adopted bool      `json:"adopted,omitempty"`
	Created time.Time `json:"created"`

	path string
	mu   sync.Mutex // ClusterID after load
}

// newID returns a random non-zero cluster id or incarnation.
func newID() (string, error) {
	var b [raftnode.IDLen / 2]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("node identity: random id: %w", err)
		}
		if id := hex.EncodeToString(b[:]); raftnode.ValidID(id) == nil {
			return id, nil
		}
	}
}

// loadIdentity reads the data dir's identity, or creates it: for a data dir
// this start found empty, a new incarnation; for one with earlier state and
// no identity (an earlier build's), an adopted one, so an upgrade needs no
// resync.
func loadIdentity(dataDir string, fresh bool, nodeID string) (*nodeIdentity, error) {
	path := filepath.Join(dataDir, identityFile)
	data, err := os.ReadFile(path)
	if err == nil {
		id := &nodeIdentity{path: path}
		if err := json.Unmarshal(data, id); err != nil {
			return nil, fmt.Errorf("node identity %s is corrupt (%v): restore it from a backup of this data dir, or treat the data dir as lost (move it away and start with an empty one)", path, err)
		}
		if id.Version != identityVersion {
			return nil, fmt.Errorf("node identity %s: version %d, this build reads version %d", path, id.Version, identityVersion)
		}
		if err := raftnode.ValidID(id.Incarnation); err != nil {
			return nil, fmt.Errorf("node identity %s is corrupt: incarnation %w", path, err)
		}
		if id.ClusterID != "" {
			if err := raftnode.ValidID(id.ClusterID); err != nil {
				return nil, fmt.Errorf("node identity %s is corrupt: cluster id %w", path, err)
			}
		}
		if id.NodeID != nodeID {
			return nil, fmt.Errorf("data dir %s belongs to node %q, not %q: start it with --node-id %s, or give node %s an empty data dir",
				dataDir, id.NodeID, nodeID, id.NodeID, nodeID)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("node identity: %w", err)
	}
	inc, err := newID()
	if err != nil {
		return nil, err
	}
	id := &nodeIdentity{Version: identityVersion, NodeID: nodeID, Incarnation: inc, Adopted: !fresh, Created: time.Now().UTC(), path: path}
	if err := id.save(); err != nil {
		return nil, err
	}
	return id, nil
}

// save writes identity.json atomically (temp file, fsync, rename, fsync dir).
func (id *nodeIdentity) save() error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileDurable(id.path, append(b, '\n')); err != nil {
		return fmt.Errorf("node identity: %w", err)
	}
	return nil
}

// writeFileDurable replaces path with data atomically and durably: a temp
// file, fsync, rename, fsync of the directory. A crash leaves the old file
// or the new one, never a torn one.
func writeFileDurable(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

func (id *nodeIdentity) clusterID() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.ClusterID
}

// setClusterID records the cluster id for good (first bootstrap or join).
func (id *nodeIdentity) setClusterID(cid string) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.ClusterID == cid {
		return nil
	}
	if id.ClusterID != "" {
		return fmt.Errorf("node identity: data dir belongs to cluster %s, not %s", id.ClusterID, cid)
	}
	id.ClusterID = cid
	if err := id.save(); err != nil {
		id.ClusterID = ""
		return err
	}
	return nil
}

// setClusterID records cid in identity.json, the raft transport and gossip.
func (s *Server) setClusterID(cid, how string) {
	if err := s.ident.setClusterID(cid); err != nil {
		s.log.Error("cluster id", "err", err)
		return
	}
	s.host.SetClusterID(cid)
	if s.members != nil {
		if err := s.members.SetClusterID(cid); err != nil {
			s.log.Warn("gossip cluster id", "err", err)
		}
	}
	s.log.Info("cluster id recorded in the data dir", "cluster_id", cid, "how", how)
}

// refusedIncarnations remembers, per group, the last raft connection refused
// because it was meant for another incarnation of this node: a peer still
// lists the earlier incarnation (or a plain address this new data dir cannot
// stand for). The node reports it as its reason not to be ready.
type refusedIncarnations struct {
	mu    sync.Mutex
	last  map[int]refusal
	other refusal // last connection from another cluster
	// counter counts refusals by reason (tollgate_raft_refused_connections_total).
	counter *prometheus.CounterVec
}

type refusal struct {
	at            time.Time
	named, remote string
}

// registerIdentityMetrics adds the identity metrics to the node's registry.
func (s *Server) registerIdentityMetrics() {
	s.refused.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_raft_refused_connections_total",
		Help: "Raft connections this node refused: meant for another incarnation of it (its data dir was replaced; reason incarnation) or from another cluster (reason cluster).",
	}, []string{"reason"})
	s.metrics.reg.MustRegister(s.refused.counter)
}

// identityRecent bounds how long a refusal keeps the node not ready: peers
// redial within a second or two while they list the earlier incarnation.
const identityRecent = 10 * time.Second

func (r *refusedIncarnations) note(group int, named, cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counter != nil {
		reason := "incarnation"
		if cluster != "" {
			reason = "cluster"
		}
		r.counter.WithLabelValues(reason).Inc()
	}
	if cluster != "" {
		r.other = refusal{at: time.Now(), remote: cluster}
		return
	}
	if r.last == nil {
		r.last = map[int]refusal{}
	}
	r.last[group] = refusal{at: time.Now(), named: named}
}

// identityReason says why this node takes no part in some group because of
// its identity, or "".
func (s *Server) identityReason() string {
	if s.ident == nil {
		return ""
	}
	s.refused.mu.Lock()
	defer s.refused.mu.Unlock()
	var gs []int
	named := ""
	for g, r := range s.refused.last {
		if time.Since(r.at) < identityRecent {
			gs = append(gs, g)
			named = r.named
		}
	}
	if len(gs) > 0 {
		slices.Sort(gs)
		earlier := "an earlier incarnation"
		if named != "" {
			earlier += " (" + named + ")"
		}
		return fmt.Sprintf("this data dir is a new incarnation (%s) of node %s and groups %v still list %s: it takes no part in them until their leader removes the earlier incarnation and adds this one; leaders do that by themselves once removing it leaves a quorum of up-to-date voters; by hand, for each group G: tollgate raft remove-server --group G --id %s, then tollgate raft add-voter --group G --id %s",
			s.ident.Incarnation, s.cfg.Node.ID, gs, earlier, s.cfg.Node.ID, s.cfg.Node.ID)
	}
	if o := s.refused.other; !o.at.IsZero() && time.Since(o.at) < identityRecent {
		return fmt.Sprintf("raft peers of another cluster (%s) are calling this node, which belongs to cluster %s: check --join and the raft addresses", o.remote, s.ident.clusterID())
	}
	if why := s.joinRefused.Load(); why != nil {
		return why.(string)
	}
	return ""
}
