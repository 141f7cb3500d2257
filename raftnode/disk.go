package raftnode

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// A node whose disk is full (or read-only, or failing) cannot append to its
// raft logs. hashicorp/raft copes with a failed log append (the leader fails
// the pending Applies and steps down; a follower answers the leader with a
// failure and is retried), but it panics when it cannot persist a new term
// (raft.setCurrentTerm), which the next election on a full disk makes it do.
// The Host therefore watches every write to its stores:
//
//   - a failed log write (StoreLogs, DeleteRange) is recorded against its
//     group and cleared by the group's next successful write;
//   - a failed stable-store write (term, vote) is retried until it succeeds,
//     holding that group's raft loop as a very slow disk would, instead of
//     returning an error that would take the whole process down; the other
//     voters elect a leader among themselves meanwhile;
//   - every DiskCheckInterval a probe writes, fsyncs and removes a small file
//     in the data dir, so a full disk is seen even when no group writes, and
//     a group whose last write failed is probed with a write to its own
//     raft.db once the data dir takes writes again;
//   - while the disk is not writable, DiskError says why (the server reports
//     not-ready and a metric) and every group this node leads is handed to
//     another voter, whose disk can take the log.
//
// When space returns the probes succeed, the held writes go through, the
// followers are caught up by their leaders and DiskError clears: nothing was
// acknowledged that a quorum had not persisted, so nothing is lost.

// slowSync: a shared-log write and fsync taking longer than this makes the
// node hand away the groups it leads, as a full disk does. A leader appends
// to its own log before it can commit, so a disk whose fsync takes seconds
// (dying, or shared with a noisy neighbour) slows every group it leads while
// the followers' disks are fine; raft itself never moves leadership for
// that, since the slow leader still sends heartbeats.
const slowSync = time.Second

// DefaultDiskCheckInterval is how often the data dir is probed.
const DefaultDiskCheckInterval = time.Second

// probeKey is the stable-store key a group's raft.db is probed with (raft's
// own keys are CurrentTerm, LastVoteTerm and LastVoteCand).
var probeKey = []byte("TollgateDiskProbe")

// diskState is the write health of one Host's data dir.
type diskState struct {
	dir string

	mu       sync.Mutex
	probeErr error              // last data-dir probe; nil when it passed
	failed   map[failKey]opFail // the last write of this kind failed (cleared by a success)
	holding  map[int]bool       // group → a stable-store write is being retried
}

// failKey: a group's log store and stable store fail and recover apart (a
// tiny term write may fit where a log batch does not).
type failKey struct {
	g      int
	stable bool
}

type opFail struct {
	op  string
	err error
	at  time.Time
}

func newDiskState(dir string) *diskState {
	return &diskState{dir: dir, failed: map[failKey]opFail{}, holding: map[int]bool{}}
}

func (d *diskState) fail(k failKey, op string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failed[k] = opFail{op: op, err: err, at: time.Now()}
}

func (d *diskState) ok(k failKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.failed) == 0 { // the common case: one map lookup per write
		return
	}
	delete(d.failed, k)
}

func (d *diskState) hold(g int, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on {
		d.holding[g] = true
	} else {
		delete(d.holding, g)
	}
}

func (d *diskState) setProbe(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.probeErr = err
}

// err describes the current state, nil when healthy.
func (d *diskState) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.probeErr == nil && len(d.failed) == 0 && len(d.holding) == 0 {
		return nil
	}
	var errs []error
	if d.probeErr != nil {
		errs = append(errs, fmt.Errorf("data dir %s not writable: %w", d.dir, d.probeErr))
	}
	held := slices.Sorted(maps.Keys(d.holding))
	for _, g := range held {
		errs = append(errs, fmt.Errorf("group %d: waiting to persist its raft term/vote", g))
	}
	keys := slices.SortedFunc(maps.Keys(d.failed), func(a, b failKey) int {
		if a.g != b.g {
			return a.g - b.g
		}
		if a.stable == b.stable {
			return 0
		}
		if a.stable {
			return 1
		}
		return -1
	})
	for _, k := range keys {
		f := d.failed[k]
		errs = append(errs, fmt.Errorf("group %d: %s failed %s ago: %w", k.g, f.op, time.Since(f.at).Round(100*time.Millisecond), f.err))
	}
	return errors.Join(errs...)
}

// failing lists the groups with a failed write, at least minAge old, not yet
// followed by a success.
func (d *diskState) failing(minAge time.Duration) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int
	for k, f := range d.failed {
		if time.Since(f.at) >= minAge && !slices.Contains(out, k.g) {
			out = append(out, k.g)
		}
	}
	return out
}

const probePrefix = ".disk-probe-"

// removeStaleProbes deletes probe files a killed process left behind.
func removeStaleProbes(dir string, log *slog.Logger) {
	stale, _ := filepath.Glob(filepath.Join(dir, probePrefix+"*"))
	for _, p := range stale {
		if err := os.Remove(p); err != nil {
			log.Warn("raftnode: cannot remove a stale disk probe file", "file", p, "error", err)
		}
	}
}

// probeDir writes, fsyncs and removes a small new file in dir: it needs
// fresh blocks, so it fails on a full disk even where rewriting an existing
// file in place would not.
func probeDir(dir string) error {
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	p := filepath.Join(dir, probePrefix+hex.EncodeToString(suffix[:]))
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	_, werr := f.Write(buf)
	serr := f.Sync()
	cerr := f.Close()
	rerr := os.Remove(p)
	return errors.Join(werr, serr, cerr, rerr)
}

// ErrDiskWrite wraps the error of a raft log write the disk refused; an
// Apply on a leader whose disk is full fails with it (raft hands the log
// store's error to the pending Applies), and the leader steps down.
var ErrDiskWrite = errors.New("raftnode: the disk refused a raft log write")

// watchedLogs is the group's log store with every write's outcome recorded,
// in front of the LogCache so that the error raft hands to pending Applies
// carries ErrDiskWrite.
type watchedLogs struct {
	raft.LogStore
	g    int
	disk *diskState
}

func (w *watchedLogs) record(op string, err error) error {
	if err != nil {
		w.disk.fail(failKey{g: w.g}, op, err)
		return fmt.Errorf("%w: %s: %w", ErrDiskWrite, op, err)
	}
	w.disk.ok(failKey{g: w.g})
	return nil
}

// IsMonotonic forwards raft.MonotonicLogStore of the wrapped store.
func (w *watchedLogs) IsMonotonic() bool {
	m, ok := w.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (w *watchedLogs) StoreLog(l *raft.Log) error {
	return w.record("log append", w.LogStore.StoreLog(l))
}

func (w *watchedLogs) StoreLogs(ls []*raft.Log) error {
	return w.record("log append", w.LogStore.StoreLogs(ls))
}

func (w *watchedLogs) DeleteRange(min, max uint64) error {
	return w.record("log compaction", w.LogStore.DeleteRange(min, max))
}

// stableFaultsForTest, set by tests only, wraps a group's stable store to
// inject write failures (a real full disk reaches a failed term write only
// when raft.db has no free page left, which a test cannot arrange reliably).
var stableFaultsForTest func(node string, group int, s raft.StableStore) raft.StableStore

// heldStable is the group's stable store (current term, vote) whose writes
// are retried until they succeed: raft panics on a failed term write.
type heldStable struct {
	raft.StableStore
	g       int
	disk    *diskState
	closing <-chan struct{}
	held    *atomic.Bool // the group's raft loop is parked in a write
	log     *slog.Logger
}

func (s *heldStable) Set(key, val []byte) error {
	return s.retry("stable store write", func() error { return s.StableStore.Set(key, val) })
}

func (s *heldStable) SetUint64(key []byte, val uint64) error {
	return s.retry("stable store write", func() error { return s.StableStore.SetUint64(key, val) })
}

func (s *heldStable) retry(op string, write func() error) error {
	k := failKey{g: s.g, stable: true}
	err := write()
	if err == nil {
		s.disk.ok(k)
		return nil
	}
	s.disk.fail(k, op, err)
	s.disk.hold(s.g, true)
	s.held.Store(true)
	s.log.Warn("raftnode: cannot persist raft term/vote; the group waits for the disk (its other voters carry on)", "group", s.g, "error", err)
	defer func() {
		s.held.Store(false)
		s.disk.hold(s.g, false)
	}()
	delay := 50 * time.Millisecond
	for {
		select {
		case <-s.closing:
			// Returning the error would make raft panic; the process is
			// stopping, so this group's loop stays parked and Shutdown
			// does not wait for it.
			select {}
		case <-time.After(delay):
		}
		if err := write(); err == nil {
			s.disk.ok(k)
			s.log.Info("raftnode: raft term/vote persisted again", "group", s.g)
			return nil
		}
		delay = min(2*delay, time.Second)
	}
}

// DiskError says why this node cannot write its raft state (a full or
// failing disk under DataDir), or returns nil. It clears by itself once
// writes succeed again.
func (h *Host) DiskError() error { return h.disk.err() }

// watchDisk probes the data dir every DiskCheckInterval and hands away the
// leadership of every group while the disk is not writable.
func (h *Host) watchDisk() {
	defer h.bg.Done()
	t := time.NewTicker(h.cfg.DiskCheckInterval)
	defer t.Stop()
	wasBad := false
	for {
		select {
		case <-h.closing:
			return
		case <-t.C:
		}
		perr := probeDir(h.cfg.DataDir)
		h.disk.setProbe(perr)
		if perr == nil {
			// The data dir takes writes again: a group whose last write
			// failed and that has not written since is probed through its
			// own raft.db (a success clears it). Only failures older than two
			// probe rounds: a small probe write may fit where the group's
			// last log batch did not, and clearing at once would flap.
			groups := h.list()
			for _, g := range h.disk.failing(2 * h.cfg.DiskCheckInterval) {
				if g >= len(groups) {
					continue // an AddGroup still opening it
				}
				if err := groups[g].store.SetUint64(probeKey, uint64(time.Now().UnixNano())); err == nil {
					h.disk.ok(failKey{g: g})
					h.disk.ok(failKey{g: g, stable: true})
				}
			}
		}
		err := h.disk.err()
		switch {
		case err != nil && !wasBad:
			h.log.Error("raftnode: disk not writable; reporting not ready and handing leaderships away", "error", err)
		case err == nil && wasBad:
			h.log.Info("raftnode: disk writable again")
		}
		wasBad = err != nil
		if err == nil {
			stalled := h.wal.Stalled()
			if stalled < slowSync {
				continue
			}
			err = fmt.Errorf("a raft log write and fsync has taken %v so far", stalled.Round(time.Millisecond))
			h.log.Warn("raftnode: slow disk; handing leaderships away", "stalled", stalled)
		}
		for _, g := range h.list() {
			if g.raft.State() != raft.Leader || g.transferring.Swap(true) {
				continue
			}
			// Not tracked by h.bg: a transfer ends with the raft instance.
			go func() {
				defer g.transferring.Store(false)
				if err := g.raft.LeadershipTransfer().Error(); err != nil {
					h.log.Warn("raftnode: could not hand leadership away from a node that cannot write", "group", g.id, "error", err)
					return
				}
				h.log.Info("raftnode: leadership handed away (disk not writable or slow)", "group", g.id)
			}()
		}
	}
}
