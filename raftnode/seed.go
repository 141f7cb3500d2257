package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/tollgate-io/tollgate/raftnode/wal"
	"go.etcd.io/bbolt"
)

// ErrHasState is wrapped by SeedGroup's refusal to seed a group directory
// that already holds raft state.
var ErrHasState = errors.New("raftnode: group already holds raft state")

// keyCurrentTerm is the stable-store key under which raft keeps its current
// term (hashicorp/raft's unexported keyCurrentTerm, unchanged since v0.1).
const keyCurrentTerm = "CurrentTerm"

// SeedGroup prepares group g of an empty data dir for disaster recovery: it
// writes data (exactly size bytes read from it: the group's FSM snapshot) as
// a raft snapshot at the given index and term into
// <dataDir>/group-<g>/snapshots, with a configuration of exactly one voter
// {nodeID, raftAddr} committed at index, and records term as the group's
// current raft term in <dataDir>/group-<g>/raft.db.
//
// When New then opens dataDir with Config.NodeID = nodeID and an advertised
// address equal to raftAddr (Bootstrap is not needed and has no effect),
// raft restores the snapshot into the group's FSM and, being the only voter
// of its configuration, this node elects itself leader of the group in term
// term+1 (so entries it appends are never older than the restored state).
// Other nodes are then added to the group as usual (AddVoter on the leader);
// they receive the snapshot through raft's InstallSnapshot.
//
// index and term are the raft position of the snapshot (for a Tollgate FSM,
// those in its snapshot header). Zero values, which a group that never
// applied a command has, are raised to 1: raft needs a non-zero snapshot
// index for the configuration to count and a term to elect from.
//
// Seeding is for an empty data dir only: SeedGroup refuses with an error
// wrapping ErrHasState, writing nothing, if the group's directory already
// holds raft state (log entries or a term in raft.db, or any snapshot; see
// HasState), and fails if raft.db is locked by a running node. On any
// failure after it started writing, it removes what it wrote.
func SeedGroup(dataDir string, group int, nodeID, raftAddr string, index, term uint64, data io.Reader, size int64) error {
	switch {
	case dataDir == "":
		return errors.New("raftnode: SeedGroup: data dir is required")
	case group < 0 || group >= MaxGroups:
		return fmt.Errorf("raftnode: SeedGroup: group %d out of range [0, %d)", group, MaxGroups)
	case nodeID == "":
		return fmt.Errorf("raftnode: SeedGroup group %d: node id is required", group)
	case data == nil:
		return fmt.Errorf("raftnode: SeedGroup group %d: data is nil", group)
	case size <= 0:
		return fmt.Errorf("raftnode: SeedGroup group %d: snapshot size %d, want > 0", group, size)
	}
	if err := checkRaftAddr(raftAddr); err != nil {
		return fmt.Errorf("raftnode: SeedGroup group %d: %w", group, err)
	}
	index, term = max(index, 1), max(term, 1)

	dir := groupDir(dataDir, group)
	if logged, err := walGroups(dataDir); err != nil {
		return fmt.Errorf("raftnode: SeedGroup group %d: %w", group, err)
	} else if logged[group] {
		return fmt.Errorf("raftnode: SeedGroup group %d: %s has raft log entries of the group (seeding is for an empty data dir only): %w", group, walDir(dataDir), ErrHasState)
	}
	if state, err := groupState(dir); err != nil {
		return fmt.Errorf("raftnode: SeedGroup group %d: %w", group, err)
	} else if state != "" {
		return fmt.Errorf("raftnode: SeedGroup group %d: %s has %s (seeding is for an empty data dir only): %w", group, dir, state, ErrHasState)
	}

	missing := func(path string) bool {
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist)
	}
	dbPath, snapDir := filepath.Join(dir, "raft.db"), filepath.Join(dir, "snapshots")
	newDir, newDB, newSnapDir := missing(dir), missing(dbPath), missing(snapDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("raftnode: SeedGroup group %d: %w", group, err)
	}
	if err := seed(dir, nodeID, raftAddr, index, term, data, size); err != nil {
		// Remove what this call created (seed removed the snapshot), unless
		// someone else's state appeared meanwhile.
		switch {
		case errors.Is(err, ErrHasState):
		case newDir:
			_ = os.RemoveAll(dir)
		default:
			if newDB {
				_ = os.Remove(dbPath)
			}
			if newSnapDir {
				_ = os.Remove(snapDir) // only if empty
			}
		}
		return fmt.Errorf("raftnode: SeedGroup group %d: %w", group, err)
	}
	return nil
}

func seed(dir, nodeID, raftAddr string, index, term uint64, data io.Reader, size int64) (err error) {
	boltOpts := *bbolt.DefaultOptions
	boltOpts.Timeout = boltOpenTimeout
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), BoltOptions: &boltOpts})
	if err != nil {
		return fmt.Errorf("open raft.db (is a node running on this data dir?): %w", err)
	}
	defer func() {
		if cerr := store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close raft.db: %w", cerr)
		}
	}()
	snaps, err := newSnapStore(dir, DefaultSnapshotRetain, wal.OSFS{}, nil)
	if err != nil {
		return fmt.Errorf("open snapshot store: %w", err)
	}
	// Checked again now that raft.db is locked: no node can have started on
	// this directory since groupState looked.
	existing, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return fmt.Errorf("inspect raft state: %w", err)
	}
	if existing {
		return fmt.Errorf("%s gained raft state meanwhile (seeding is for an empty data dir only): %w", dir, ErrHasState)
	}

	conf := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter,
		ID:       raft.ServerID(nodeID),
		Address:  raft.ServerAddress(raftAddr),
	}}}
	// The snapshot is written into snapshots/<id>.tmp, which raft ignores,
	// and only renamed into place (becoming state) once complete and after
	// the term is recorded: an interruption leaves either nothing raft
	// would use, or a term without a snapshot (a node that never elects
	// itself, which HasState reports), never a snapshot without its term.
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, term, conf, index, peerEncoder{})
	if err != nil {
		return fmt.Errorf("create snapshot: %w", err)
	}
	n, err := io.CopyN(sink, data, size)
	if err != nil {
		_ = sink.Cancel()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("write snapshot: data ended after %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := store.SetUint64([]byte(keyCurrentTerm), term); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("record current term: %w", err)
	}
	if err := sink.Close(); err != nil {
		_ = os.RemoveAll(filepath.Join(dir, "snapshots", sink.ID()+".tmp"))
		_ = os.RemoveAll(filepath.Join(dir, "snapshots", sink.ID()))
		_ = store.SetUint64([]byte(keyCurrentTerm), 0) // raft reads 0 as "no state"
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

// HasState reports whether any of the group directories group-0 ..
// group-<groups-1> of dataDir (or more, when its group list records groups
// added at runtime) holds raft state: log entries or a term in raft.db, or
// a snapshot. A data dir that does not exist has none. It fails if a raft.db
// is locked by a running node (after waiting 2 s for the lock), or a
// raft.db or the group list cannot be read. Nothing is created or modified.
func HasState(dataDir string, groups int) (bool, error) {
	if groups < 1 || groups > MaxGroups {
		return false, fmt.Errorf("raftnode: HasState: groups = %d, want 1..%d", groups, MaxGroups)
	}
	listed, err := ListedGroups(dataDir)
	if err != nil {
		return false, fmt.Errorf("raftnode: HasState: %w", err)
	}
	groups = max(groups, listed)
	logged, err := walGroups(dataDir)
	if err != nil {
		return false, fmt.Errorf("raftnode: HasState: %w", err)
	}
	for g := 0; g < groups; g++ {
		if logged[g] {
			return true, nil
		}
		state, err := groupState(groupDir(dataDir, g))
		if err != nil {
			return false, fmt.Errorf("raftnode: HasState group %d: %w", g, err)
		}
		if state != "" {
			return true, nil
		}
	}
	return false, nil
}

// walGroups returns the groups with entries in dataDir's shared raft log,
// reading it without writing anything.
func walGroups(dataDir string) (map[int]bool, error) {
	if _, err := os.Stat(walDir(dataDir)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	w, err := wal.Open(walDir(dataDir), wal.Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read the raft log: %w", err)
	}
	defer w.Close()
	out := map[int]bool{}
	for _, g := range w.Groups() {
		out[int(g)] = true
	}
	return out, nil
}

func groupDir(dataDir string, g int) string {
	return filepath.Join(dataDir, fmt.Sprintf("group-%d", g))
}

// groupState describes the raft state found in a group directory, or
// returns "" if there is none. It only reads.
func groupState(dir string) (string, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", err
	case !fi.IsDir():
		return "", fmt.Errorf("%s is not a directory", dir)
	}

	entries, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	for _, e := range entries {
		// raft writes a snapshot into <id>.tmp and renames it when
		// complete; leftovers of an interrupted write are not state.
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			return "raft snapshot " + e.Name(), nil
		}
	}

	path := filepath.Join(dir, "raft.db")
	fi, err = os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", err
	case fi.Size() == 0:
		return "", nil
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: boltOpenTimeout})
	if errors.Is(err, bbolt.ErrTimeout) {
		return "", fmt.Errorf("%s is locked (is a node running on this data dir?): %w", path, err)
	}
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	// raft-boltdb keeps the log in bucket "logs" and term and vote in
	// "conf"; a raft.db created by a node that was never bootstrapped nor
	// joined has both buckets, empty. Any key in any bucket is state,
	// except a zero CurrentTerm (which raft reads as no state either).
	var state string
	stop := errors.New("stop")
	err = db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte("logs")); b != nil {
			if k, _ := b.Cursor().First(); k != nil {
				state = "raft log entries in raft.db"
				return stop
			}
		}
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				if string(k) == keyCurrentTerm && len(v) == 8 && binary.BigEndian.Uint64(v) == 0 {
					return nil
				}
				state = fmt.Sprintf("key %q in raft.db bucket %q", k, name)
				return stop
			})
		})
	})
	if err != nil && !errors.Is(err, stop) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return state, nil
}

// checkRaftAddr applies Config.AdvertiseAddr's rules to a seeded address.
func checkRaftAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return fmt.Errorf("raft address %q: %w", addr, err)
	case host == "" || port == "" || port == "0":
		return fmt.Errorf("raft address %q must have a host and a non-zero port", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("raft address %q must not be an unspecified address", addr)
	}
	return nil
}

// peerEncoder encodes a peer as raft.NetworkTransport does (its address),
// for the legacy Peers field of snapshot metadata: EncodePeer is the only
// Transport method a snapshot store's Create calls.
type peerEncoder struct{ raft.Transport }

func (peerEncoder) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte {
	return []byte(addr)
}
