package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/tollgate-io/tollgate/raftnode/wal"
	"go.etcd.io/bbolt"
)

// OfflineGroup is what a stopped node's data dir holds for one group, read
// without starting raft (InspectGroup).
type OfflineGroup struct {
	Group    int
	HasState bool // any log entry, term or snapshot
	// FirstIndex..LastIndex is the log on disk (0, 0 when empty); LastTerm is
	// the term of the last entry, or of the newest snapshot when the log is
	// empty.
	FirstIndex, LastIndex, LastTerm uint64
	CurrentTerm                     uint64 // raft's persisted current term
	SnapshotIndex, SnapshotTerm     uint64 // newest snapshot (0 when none)
	// Configuration is the latest raft configuration this node knows
	// (committed or not): the last configuration entry of the log, else the
	// newest snapshot's. ConfigurationIndex is where it was written.
	Configuration      raft.Configuration
	ConfigurationIndex uint64
}

// InspectGroup reads group g of a stopped node's raft data dir (the dir
// holding group-<g>/): its log bounds, term, newest snapshot and latest
// configuration, as raft would find them at start. It fails if a node holds
// the group's raft.db (after waiting 2 s for the lock). A group directory or
// raft.db that does not exist is reported as no state, and nothing is created.
func InspectGroup(dataDir string, g int) (OfflineGroup, error) {
	out := OfflineGroup{Group: g}
	if g < 0 || g >= MaxGroups {
		return out, fmt.Errorf("raftnode: group %d out of range [0, %d)", g, MaxGroups)
	}
	dir := groupDir(dataDir, g)
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); errors.Is(err, os.ErrNotExist) {
		if state, err := groupState(dir); err != nil || state == "" {
			return out, err // no raft.db and no snapshot: nothing here
		}
	}
	st, err := openOfflineGroup(dataDir, g, false)
	if err != nil {
		return out, fmt.Errorf("raftnode: group %d: %w", g, err)
	}
	defer st.close()
	if out.HasState, err = raft.HasExistingState(st.logs, st.store, st.snaps); err != nil {
		return out, fmt.Errorf("raftnode: group %d: inspect state: %w", g, err)
	}
	if out.CurrentTerm, err = st.store.GetUint64([]byte(keyCurrentTerm)); err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return out, fmt.Errorf("raftnode: group %d: read current term: %w", g, err)
	}
	snaps, err := st.snaps.List()
	if err != nil {
		return out, fmt.Errorf("raftnode: group %d: list snapshots: %w", g, err)
	}
	if len(snaps) > 0 {
		s := snaps[0] // newest first
		out.SnapshotIndex, out.SnapshotTerm = s.Index, s.Term
		out.Configuration, out.ConfigurationIndex = s.Configuration.Clone(), s.ConfigurationIndex
		out.LastIndex, out.LastTerm = s.Index, s.Term
	}
	first, err := st.logs.FirstIndex()
	if err != nil {
		return out, fmt.Errorf("raftnode: group %d: read log: %w", g, err)
	}
	last, err := st.logs.LastIndex()
	if err != nil {
		return out, fmt.Errorf("raftnode: group %d: read log: %w", g, err)
	}
	out.FirstIndex = first
	if last == 0 {
		return out, nil
	}
	// raft rebuilds its configuration at start the same way: the snapshot's,
	// then every configuration entry after the snapshot, in order.
	for i := max(first, out.SnapshotIndex+1); i <= last; i++ {
		var l raft.Log
		if err := st.logs.GetLog(i, &l); err != nil {
			return out, fmt.Errorf("raftnode: group %d: read log entry %d: %w", g, i, err)
		}
		if l.Type != raft.LogConfiguration {
			continue
		}
		c, err := decodeConfiguration(l.Data)
		if err != nil {
			return out, fmt.Errorf("raftnode: group %d: configuration entry %d: %w", g, i, err)
		}
		out.Configuration, out.ConfigurationIndex = c, i
	}
	if last >= out.LastIndex {
		var l raft.Log
		if err := st.logs.GetLog(last, &l); err != nil {
			return out, fmt.Errorf("raftnode: group %d: read log entry %d: %w", g, last, err)
		}
		out.LastIndex, out.LastTerm = last, l.Term
	}
	return out, nil
}

// RecoverGroup forces group g of a stopped node's raft data dir to the given
// configuration with hashicorp/raft's RecoverCluster, for a group that lost
// its quorum for good. It keeps this node's data: raft restores the newest
// snapshot into fsm, applies every command of the log after it (so entries
// this node logged but never saw committed are kept too), writes the result
// as a new snapshot that carries the new configuration, and empties the log.
// The node then starts as a member of exactly that configuration.
//
// fsm must be a fresh instance of the group's real state machine, built as the
// server builds it: the snapshot RecoverCluster writes is fsm's own, so a
// state machine that dropped or refused part of the state would lose it. If
// fsm refuses the snapshot (a Tollgate FSM does while halted on an entry it
// cannot apply) RecoverCluster fails before it writes anything. fsm is
// spent afterwards; the server builds its own at start.
func RecoverGroup(dataDir string, g int, nodeID string, fsm raft.FSM, conf raft.Configuration, logger *slog.Logger) error {
	switch {
	case g < 0 || g >= MaxGroups:
		return fmt.Errorf("raftnode: group %d out of range [0, %d)", g, MaxGroups)
	case nodeID == "":
		return fmt.Errorf("raftnode: recover group %d: node id is required", g)
	case fsm == nil:
		return fmt.Errorf("raftnode: recover group %d: fsm is nil", g)
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter {
			if err := checkRaftAddr(string(s.Address)); err != nil {
				return fmt.Errorf("raftnode: recover group %d: server %s: %w", g, s.ID, err)
			}
		}
	}
	st, err := openOfflineGroup(dataDir, g, true)
	if err != nil {
		return fmt.Errorf("raftnode: recover group %d: %w", g, err)
	}
	defer st.close()
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(nodeID)
	rc.Logger = newHCLogAdapter(logger.With("group", g), slog.LevelWarn, "raft-recover")
	rc.NoLegacyTelemetry = true
	if err := raft.RecoverCluster(rc, fsm, st.logs, st.store, st.snaps, peerEncoder{}, conf); err != nil {
		return fmt.Errorf("raftnode: recover group %d: %w", g, err)
	}
	return nil
}

// offlineGroup is a group's stores opened without raft.
type offlineGroup struct {
	store *raftboltdb.BoltStore // term and vote
	logs  raft.LogStore         // the group's log
	wal   *wal.WAL              // nil when the log is still in raft.db
	snaps *snapStore
}

// openOfflineGroup opens group g of dataDir without raft. With write, the
// shared log is opened for writing (its lock held) and a log an older
// version left in raft.db is moved into it first, as a starting node would;
// without, nothing is written and such a log is read where it is.
func openOfflineGroup(dataDir string, g int, write bool) (*offlineGroup, error) {
	dir := groupDir(dataDir, g)
	boltOpts := *bbolt.DefaultOptions
	boltOpts.Timeout = boltOpenTimeout
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), BoltOptions: &boltOpts})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("%s is locked (is a node running on this data dir?): %w", filepath.Join(dir, "raft.db"), err)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(dir, "raft.db"), err)
	}
	o := &offlineGroup{store: store, logs: store}
	fail := func(err error) (*offlineGroup, error) {
		o.close()
		return nil, err
	}
	if write {
		if o.wal, err = wal.Open(walDir(dataDir), wal.Options{}); err != nil {
			return fail(fmt.Errorf("open the raft log: %w", err))
		}
		if o.logs, err = groupLog(o.wal, g, store, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			return fail(err)
		}
	} else if last, err := store.LastIndex(); err != nil {
		return fail(fmt.Errorf("read %s: %w", filepath.Join(dir, "raft.db"), err))
	} else if last == 0 {
		if o.wal, err = wal.Open(walDir(dataDir), wal.Options{ReadOnly: true}); err != nil {
			return fail(fmt.Errorf("open the raft log: %w", err))
		}
		o.logs = o.wal.Group(uint16(g))
	}
	// On the OS, like the log here; .tmp leftovers are left alone (they are
	// ignored, and a starting node removes them).
	if o.snaps, err = newSnapStore(dir, DefaultSnapshotRetain, wal.OSFS{}, nil); err != nil {
		return fail(fmt.Errorf("open snapshot store: %w", err))
	}
	return o, nil
}

func (o *offlineGroup) close() {
	if o.wal != nil {
		_ = o.wal.Close()
	}
	_ = o.store.Close()
}

// decodeConfiguration is raft.DecodeConfiguration, which panics on bad input.
func decodeConfiguration(b []byte) (c raft.Configuration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("undecodable configuration: %v", r)
		}
	}()
	return raft.DecodeConfiguration(b), nil
}
