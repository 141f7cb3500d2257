package raftnode

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/raft"
)

// ErrSnapshotCorrupt: a group's newest snapshot cannot be read and raft
// could not start the group from what is left (the older snapshot is
// missing too, or the log no longer reaches back to it). New refuses to
// open the group rather than let raft panic on the first log entry it
// lacks; the error names the group, the snapshot and the remedy.
var ErrSnapshotCorrupt = errors.New("snapshot corrupt")

// SnapshotCorruptError is the error New returns (wrapped, joined with the
// other groups' errors) for a group it refuses; it matches
// ErrSnapshotCorrupt with errors.Is. Path is the damaged snapshot's file
// or directory.
type SnapshotCorruptError struct {
	Group int
	Path  string
	msg   string
}

func (e *SnapshotCorruptError) Error() string { return e.msg }
func (e *SnapshotCorruptError) Unwrap() error { return ErrSnapshotCorrupt }

// CorruptGroups lists the groups an error from New refused with
// ErrSnapshotCorrupt, in the order found (nil if none).
func CorruptGroups(err error) []*SnapshotCorruptError {
	var out []*SnapshotCorruptError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *SnapshotCorruptError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		default:
			walk(errors.Unwrap(err))
		}
	}
	walk(err)
	return out
}

// snapshotRemedy is what an operator does about ErrSnapshotCorrupt. The
// node's other groups share its WAL and identity, so the unit to wipe is
// the whole data dir, and the documented paths start from there.
const snapshotRemedy = "this data dir cannot restore the group: if the group has other voters, stop the node, wipe its data dir and start it again " +
	"(docs/operations.md, \"Replace a node that lost its disk\"); on a single-node cluster, seed an empty data dir from a backup " +
	"(tollgate snapshot restore --offline)"

// checkSnapshots tells, before raft.NewRaft, whether raft can start a group
// from its snapshots and log. raft restores the newest snapshot it can open
// (snapStore.Open verifies the state file's CRC; a snapshot whose
// meta.json is unreadable is not even listed), and then applies the log
// from that snapshot's index+1. If it had to skip a newer snapshot and the
// log starts after that point, raft panics at the first missing entry
// ("failed to get log index=N: log not found") and the node crash-loops.
// checkSnapshots finds that case and returns an error wrapping
// ErrSnapshotCorrupt instead (the caller prefixes the group). When every snapshot is intact it reads the
// newest state file once (its CRC); it returns the snapshot raft will
// restore, verified, so that raft's own Open of it can skip a second CRC
// pass (checkedSnapshots).
func checkSnapshots(group int, snaps *snapStore, logs raft.LogStore) (*raft.SnapshotMeta, error) {
	metas, err := snaps.List()
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	snapRoot := snaps.dir
	// Directories raft does not list: their meta.json (or state.bin) is
	// missing or damaged.
	sc, err := snaps.scan()
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	unlisted := slices.Sorted(maps.Keys(sc.bad))
	if len(metas) == 0 && len(unlisted) == 0 {
		return nil, nil
	}

	// The snapshot raft will restore: the first (newest) one that opens.
	var chosen *raft.SnapshotMeta
	var bad []string // why each newer one was skipped
	var badPath string
	for _, m := range metas {
		_, rc, err := snaps.Open(m.ID)
		if err != nil {
			if badPath == "" {
				badPath = filepath.Join(snapRoot, m.ID, snapStateName)
			}
			bad = append(bad, fmt.Sprintf("%s (index %d): %v", filepath.Join(snapRoot, m.ID, snapStateName), m.Index, err))
			continue
		}
		_ = rc.Close()
		chosen = m
		break
	}
	for _, id := range unlisted {
		idx, ok := snapshotIndexFromID(id)
		if !ok || chosen == nil || idx > chosen.Index {
			if badPath == "" {
				badPath = filepath.Join(snapRoot, id)
			}
			bad = append(bad, fmt.Sprintf("%s: unreadable (%v)", filepath.Join(snapRoot, id), sc.bad[id]))
		}
	}
	if len(bad) == 0 {
		return chosen, nil
	}

	first, err := logs.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("read log first index: %w", err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read log last index: %w", err)
	}
	if chosen == nil {
		return nil, &SnapshotCorruptError{Group: group, Path: badPath, msg: fmt.Sprintf("no snapshot can be read (%s); log holds %d..%d: %v; %s",
			strings.Join(bad, "; "), first, last, ErrSnapshotCorrupt, snapshotRemedy)}
	}
	// raft needs chosen.Index+1..last in the log (nothing if the log ends
	// at or before the snapshot).
	if last <= chosen.Index || first <= chosen.Index+1 {
		return chosen, nil
	}
	return nil, &SnapshotCorruptError{Group: group, Path: badPath, msg: fmt.Sprintf("newest snapshot unreadable (%s); the older snapshot %s is at index %d but the log starts at %d, so entries %d..%d are gone: %v; %s",
		strings.Join(bad, "; "), filepath.Join(snapRoot, chosen.ID), chosen.Index, first, chosen.Index+1, first-1,
		ErrSnapshotCorrupt, snapshotRemedy)}
}

// snapshotIndexFromID parses the index out of a snapshot directory name,
// <term>-<index>-<unix ms>.
func snapshotIndexFromID(id string) (uint64, bool) {
	parts := strings.Split(id, "-")
	if len(parts) != 3 {
		return 0, false
	}
	idx, err := strconv.ParseUint(parts[1], 10, 64)
	return idx, err == nil
}

// checkedSnapshots is the snapshot store raft gets when checkSnapshots
// verified the snapshot raft will restore: raft's first Open of that
// snapshot (its restore in NewRaft) reads the state file without computing
// its CRC again, which on a large node is seconds of start time (CRC-64 at
// about 1.7 GB/s on one core). Everything else is the snapStore's.
type checkedSnapshots struct {
	*snapStore

	mu       sync.Mutex
	verified *raft.SnapshotMeta // nil once used
}

func (s *checkedSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	m := s.verified
	if m != nil && m.ID == id {
		s.verified = nil
	}
	s.mu.Unlock()
	return s.open(id, m == nil || m.ID != id)
}
