package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// GroupHasState reports whether group g has any raft state (log, term or
// snapshot) on this node: a node with state is (or was) part of the group and
// must never be bootstrapped again.
func (h *Host) GroupHasState(g int) (bool, error) {
	gr := h.group(g)
	ok, err := raft.HasExistingState(gr.logs, gr.store, gr.snaps)
	if err != nil {
		return false, fmt.Errorf("raftnode: group %d: check state: %w", g, err)
	}
	return ok, nil
}

// BootstrapGroup bootstraps group g with the given voters if it has no state.
// Every node of a new cluster may call it with the identical configuration (raft
// makes that safe: the first election picks one history). It returns
// raft.ErrCantBootstrap (wrapped) when the group already has state.
func (h *Host) BootstrapGroup(g int, servers []raft.Server) error {
	if len(servers) == 0 {
		return fmt.Errorf("raftnode: bootstrap group %d: no servers", g)
	}
	conf := raft.Configuration{Servers: append([]raft.Server(nil), servers...)}
	if err := h.group(g).raft.BootstrapCluster(conf).Error(); err != nil {
		return fmt.Errorf("raftnode: bootstrap group %d: %w", g, err)
	}
	h.log.Info("raftnode: bootstrapped group", "group", g, "voters", len(servers))
	return nil
}

// GroupLoaded reports whether group g reached the readiness WaitReady waits for
// (a known leader, and every entry that was on local disk at start applied).
// Latched like Loaded.
func (h *Host) GroupLoaded(g int) bool {
	gr := h.group(g)
	if gr.ready.Load() {
		return true
	}
	if h.groupReady(gr) {
		gr.ready.Store(true)
		return true
	}
	return false
}

// Snapshot takes a snapshot of group g through raft (so it lands in the
// group's snapshot store and compacts the log) and opens it. If nothing was
// applied since the newest snapshot, that one is opened instead. The caller
// should run a Barrier first when the snapshot must include every write
// acknowledged so far, and must close the reader.
func (h *Host) Snapshot(g int, timeout time.Duration) (*raft.SnapshotMeta, io.ReadCloser, error) {
	gr := h.group(g)
	fut := gr.raft.Snapshot()
	err := fut.Error()
	if err == nil {
		meta, rc, err := fut.Open()
		if err != nil {
			return nil, nil, fmt.Errorf("raftnode: group %d: open snapshot: %w", g, err)
		}
		return meta, rc, nil
	}
	if !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil, nil, fmt.Errorf("raftnode: group %d: snapshot: %w", g, err)
	}
	list, err := gr.snaps.List()
	if err != nil || len(list) == 0 {
		return nil, nil, fmt.Errorf("raftnode: group %d: no snapshot to open (list: %v)", g, err)
	}
	meta, rc, err := gr.snaps.Open(list[0].ID)
	if err != nil {
		return nil, nil, fmt.Errorf("raftnode: group %d: open snapshot %s: %w", g, list[0].ID, err)
	}
	return meta, rc, nil
}

// SnapshotForRestart snapshots, all at once, every group whose log holds at
// least minEntries entries past its newest snapshot, and waits for them (or
// ctx). A node stopping gracefully calls it last before Shutdown: the next
// start then restores one snapshot per group instead of re-applying the tail
// of the log, which on a node with tens of millions of series is most of the
// restart time. Groups with less to replay are skipped (the snapshot would
// cost more than it saves). A snapshot that ctx cuts short is finished by
// raft before Shutdown returns, or abandoned by a kill: the snapshot store
// writes to a temporary directory and renames it only when complete.
func (h *Host) SnapshotForRestart(ctx context.Context, minEntries uint64) error {
	var wg sync.WaitGroup
	groups := h.list()
	errs := make([]error, len(groups))
	for i, g := range groups {
		if g.raft == nil || g.raft.State() == raft.Shutdown {
			continue
		}
		snap, err := strconv.ParseUint(g.raft.Stats()["last_snapshot_index"], 10, 64)
		if err != nil {
			continue
		}
		if applied := g.raft.AppliedIndex(); applied < snap+minEntries {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- g.raft.Snapshot().Error() }()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
					errs[i] = fmt.Errorf("group %d: snapshot before stopping: %w", g.id, err)
				}
			case <-ctx.Done():
				errs[i] = fmt.Errorf("group %d: snapshot before stopping: %w", g.id, ctx.Err())
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
