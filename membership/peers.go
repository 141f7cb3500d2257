package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/hashicorp/serf/serf"
)

// peersFileName holds the gossip addresses of the members this node last
// knew, so that a node restarted without --join (typically the cluster's
// first node) finds the others at once.
//
// serf's own snapshot is not enough for that: it is a buffered log flushed at
// most every 500 ms and only when another line follows, so after a SIGKILL it
// often lacks the members that joined last. A node that rejoins nobody is
// still probed by the others (they think it alive), so it never learns the
// members it missed until one of them happens to push its state (memberlist's
// 30 s push-pull). Meanwhile the node cannot tell which of its raft peers are
// alive or what version they run.
//
// Format (JSON, rewritten whole through a temporary file, fsync and rename):
//
//	{"version":1,"peers":[{"name":"node-2","addr":"10.0.0.6:7302","ver":3}, ...]}
//
// "ver" is the cluster version the member last advertised (absent in files
// of earlier builds). Versions only rise (downgrades are unsupported), so a
// recorded version is a lower bound on the member's: the server's version
// gate counts it for a raft peer that gossip does not list yet, as it counts
// the last tag of a member that is down (RecordedVersion).
//
// The file is a hint: one that cannot be read is reported and ignored (the
// node then waits to be contacted, as without the file).
const peersFileName = "gossip-peers.json"

// maxSavedPeers bounds the file and the addresses tried at start (each
// unreachable one can cost a TCP timeout).
const maxSavedPeers = 16

type savedPeer struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	Ver  int    `json:"ver,omitempty"`
}

type peersFile struct {
	Version int         `json:"version"`
	Peers   []savedPeer `json:"peers"`
}

// readPeers loads the saved peers (none when the file does not exist).
func readPeers(dir string) ([]savedPeer, error) {
	b, err := os.ReadFile(filepath.Join(dir, peersFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f peersFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", peersFileName, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("%s: version %d, want 1", peersFileName, f.Version)
	}
	for _, p := range f.Peers {
		if _, _, err := net.SplitHostPort(p.Addr); err != nil || p.Name == "" {
			return nil, fmt.Errorf("%s: bad peer %q at %q", peersFileName, p.Name, p.Addr)
		}
	}
	return f.Peers, nil
}

// writePeers replaces the file atomically.
func writePeers(dir string, peers []savedPeer) error {
	b, err := json.Marshal(peersFile{Version: 1, Peers: peers})
	if err != nil {
		return err
	}
	path := filepath.Join(dir, peersFileName)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// currentPeers is the members worth rejoining: every other member not gone
// for good, sorted by name, at most maxSavedPeers (alive ones first).
func currentPeers(self string, ms []serf.Member) []savedPeer {
	var alive, other []savedPeer
	for _, sm := range ms {
		if sm.Name == self || sm.Status == serf.StatusLeft || sm.Status == serf.StatusLeaving {
			continue
		}
		p := savedPeer{Name: sm.Name, Addr: net.JoinHostPort(sm.Addr.String(), strconv.Itoa(int(sm.Port))),
			Ver: ParseClusterVersion(sm.Tags[verTag])}
		if sm.Status == serf.StatusAlive {
			alive = append(alive, p)
		} else {
			other = append(other, p)
		}
	}
	byName := func(a, b savedPeer) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	}
	slices.SortFunc(alive, byName)
	slices.SortFunc(other, byName)
	out := append(alive, other...)
	if len(out) > maxSavedPeers {
		out = out[:maxSavedPeers]
	}
	return out
}

// SavedPeers is the gossip addresses of the members this node knew when it
// last ran (from its data dir; none without one). The server joins them at
// start, after any --join seeds.
func (m *Membership) SavedPeers() []string {
	out := make([]string, 0, len(m.saved))
	for _, p := range m.saved {
		if p.Name != m.cfg.NodeID {
			out = append(out, p.Addr)
		}
	}
	return out
}

// recordPeers rewrites the peers file when the set of members changed.
func (m *Membership) recordPeers() {
	if m.cfg.DataDir == "" {
		return
	}
	peers := currentPeers(m.cfg.NodeID, m.serf.Members())
	if len(peers) == 0 || slices.Equal(peers, m.lastSaved) {
		// Never replace what was known with nothing: a node that starts
		// alone must still find the others on its next start.
		return
	}
	if err := writePeers(m.cfg.DataDir, peers); err != nil {
		m.log.Warn("membership: record the known members (used to rejoin them after a restart)", "err", err)
		return
	}
	m.savedMu.Lock()
	m.lastSaved = peers
	m.savedMu.Unlock()
}

// RecordedVersion is the cluster version member id last advertised as this
// node's peers record holds it, 0 when the record does not name it (or names
// no version: a file of an earlier build). After a restart that lets the
// version gate count a raft peer that gossip does not list yet.
func (m *Membership) RecordedVersion(id string) int {
	m.savedMu.Lock()
	defer m.savedMu.Unlock()
	for _, p := range m.lastSaved {
		if p.Name == id {
			return p.Ver
		}
	}
	return 0
}
