package nodeid

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

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

// File is the identity's file name in a data dir.
const File = "identity.json"

// Version versions identity.json.
const Version = 1

// Identity is identity.json.
type Identity struct {
	Version     int    `json:"version"`
	NodeID      string `json:"node_id"`
	Cluster     string `json:"cluster_id,omitempty"` // "" until the node bootstraps or joins a cluster
	Incarnation string `json:"incarnation"`
	// Adopted: the data dir was written by an earlier build (no identity.json
	// next to its raft state); configurations listing this node's plain raft
	// address mean this data.
	Adopted bool      `json:"adopted,omitempty"`
	Created time.Time `json:"created"`

	path string
	mu   sync.Mutex // ClusterID after load
}

// NewID returns a random non-zero cluster id or incarnation.
func NewID() (string, error) {
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

// Load reads the data dir's identity, or creates it: for a data dir
// this start found empty, a new incarnation; for one with earlier state and
// no identity (an earlier build's), an adopted one, so an upgrade needs no
// resync.
func Load(dataDir string, fresh bool, nodeID string) (*Identity, error) {
	path := filepath.Join(dataDir, File)
	data, err := os.ReadFile(path)
	if err == nil {
		id := &Identity{path: path}
		if err := json.Unmarshal(data, id); err != nil {
			return nil, fmt.Errorf("node identity %s is corrupt (%v): restore it from a backup of this data dir, or treat the data dir as lost (move it away and start with an empty one)", path, err)
		}
		if id.Version != Version {
			return nil, fmt.Errorf("node identity %s: version %d, this build reads version %d", path, id.Version, Version)
		}
		if err := raftnode.ValidID(id.Incarnation); err != nil {
			return nil, fmt.Errorf("node identity %s is corrupt: incarnation %w", path, err)
		}
		if id.Cluster != "" {
			if err := raftnode.ValidID(id.Cluster); err != nil {
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
	inc, err := NewID()
	if err != nil {
		return nil, err
	}
	id := &Identity{Version: Version, NodeID: nodeID, Incarnation: inc, Adopted: !fresh, Created: time.Now().UTC(), path: path}
	if err := id.save(); err != nil {
		return nil, err
	}
	return id, nil
}

// save writes identity.json atomically (temp file, fsync, rename, fsync dir).
func (id *Identity) save() error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFileDurable(id.path, append(b, '\n')); err != nil {
		return fmt.Errorf("node identity: %w", err)
	}
	return nil
}

// WriteFileDurable replaces path with data atomically and durably: a temp
// file, fsync, rename, fsync of the directory. A crash leaves the old file
// or the new one, never a torn one.
func WriteFileDurable(path string, data []byte) error {
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

// ClusterID is the cluster the data dir belongs to, "" before it bootstraps
// or joins one.
func (id *Identity) ClusterID() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.Cluster
}

// SetClusterID records the cluster id for good (first bootstrap or join).
func (id *Identity) SetClusterID(cid string) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.Cluster == cid {
		return nil
	}
	if id.Cluster != "" {
		return fmt.Errorf("node identity: data dir belongs to cluster %s, not %s", id.Cluster, cid)
	}
	id.Cluster = cid
	if err := id.save(); err != nil {
		id.Cluster = ""
		return err
	}
	return nil
}
