package raftnode

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/tollgate-io/tollgate/raftnode/wal"
)

// walDir is where a node's shared raft log lives (package wal).
func walDir(dataDir string) string { return filepath.Join(dataDir, "wal") }

// testWALOptions, when set, adjusts the options a node's shared log opens
// with (its file layer, its segment size), by data dir. It is a test knob of
// this package: only its own tests set it (the power-loss and slow-disk
// tests put raftnode/wal/powerfs there); nothing else can reach it, so
// production always opens the log on the OS with the default segments.
var testWALOptions func(dataDir string, o *wal.Options)

// walOptions are the options dataDir's log opens with.
func walOptions(dataDir string, noSync bool) wal.Options {
	o := wal.Options{NoSync: noSync}
	if testWALOptions != nil {
		testWALOptions(dataDir, &o)
	}
	return o
}

// upgradeChunk is how many entries one append of the upgrade copy carries.
const upgradeChunk = 1024

// groupLog returns group g's log in the shared WAL, first moving any entries
// that an older version left in the group's raft.db into it.
//
// The move is idempotent: while raft.db holds entries they are the log, so
// whatever an interrupted earlier copy left in the WAL is removed and the
// copy starts again; raft.db's entries are deleted (one transaction) only
// once the whole copy is durable.
func groupLog(w *wal.WAL, g int, bolt *raftboltdb.BoltStore, log *slog.Logger) (raft.LogStore, error) {
	l := w.Group(uint16(g))
	first, err := bolt.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("read raft.db log: %w", err)
	}
	last, err := bolt.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read raft.db log: %w", err)
	}
	if last == 0 {
		return l, nil
	}
	if wl, err := l.LastIndex(); err != nil {
		return nil, err
	} else if wl != 0 {
		wf, _ := l.FirstIndex()
		if err := l.DeleteRange(wf, wl); err != nil {
			return nil, fmt.Errorf("drop an interrupted log upgrade: %w", err)
		}
	}
	batch := make([]*raft.Log, 0, upgradeChunk)
	for i := first; i <= last; i++ {
		e := new(raft.Log)
		if err := bolt.GetLog(i, e); err != nil {
			return nil, fmt.Errorf("upgrade: read raft.db entry %d: %w", i, err)
		}
		batch = append(batch, e)
		if len(batch) == upgradeChunk || i == last {
			if err := l.StoreLogs(batch); err != nil {
				return nil, fmt.Errorf("upgrade: copy entries to the shared log: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := bolt.DeleteRange(first, last); err != nil {
		return nil, fmt.Errorf("upgrade: delete the copied entries from raft.db: %w", err)
	}
	log.Info("raftnode: moved the group's raft log from raft.db into the shared log", "group", g, "first", first, "last", last)
	return l, nil
}

// LogStats returns the counters of the node's shared raft log.
func (h *Host) LogStats() wal.Stats {
	if h.wal == nil {
		return wal.Stats{}
	}
	return h.wal.Stats()
}
