package raftnode

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/raft"
)

// ErrGroupExists is returned by AddGroup for a group this host already runs.
var ErrGroupExists = errors.New("raftnode: group already exists")

// ErrGroupOutOfRange is returned by AddGroup for an id that is not the next
// group of this host.
var ErrGroupOutOfRange = errors.New("raftnode: group id out of range")

// AddGroup creates group id on this running host and starts its raft, like
// the groups New opened: its own directory (raft.db for term and vote,
// snapshots/), a log in the shared WAL, a layer on the shared port, the
// leadership queue feeding Config.LeaderNotify, succession, disk watching,
// readiness (WaitReady and Loaded then wait for it too) and Shutdown. The
// new group is recorded in the data dir's group list (grouplist.go) before
// AddGroup returns, so New opens it again after a restart.
//
// Group ids are dense: id must be Groups(), the next one. A group that is
// already running is refused with ErrGroupExists, any other id with
// ErrGroupOutOfRange, and a host that is shutting down with ErrShutdown.
//
// The group starts without a configuration unless Config.Bootstrap is set
// (then this node is its only voter): as at start, a new cluster's group is
// bootstrapped with BootstrapGroup (every voter may call it with the same
// servers), or this node is added to it by the group's leader. If the
// directory already holds state for id (the host crashed after an earlier
// AddGroup had opened the group and before it was recorded), raft restores
// it into fsm and the group carries on from it.
//
// AddGroup calls are serialised, and Shutdown waits for one in flight;
// readers of the group list (Raft, Groups, WaitReady, ...) do not wait for
// them. ctx is checked before the group is built; building it is not
// interrupted (with Config.Bootstrap on a disk that refuses writes, the
// bootstrap's term write is held until the disk takes it, as in New).
func (h *Host) AddGroup(ctx context.Context, id int, fsm raft.FSM) error {
	if fsm == nil {
		return fmt.Errorf("raftnode: AddGroup: group %d: fsm is nil", id)
	}
	if id < 0 || id >= MaxGroups {
		return fmt.Errorf("%w: AddGroup: group %d, want 0..%d", ErrGroupOutOfRange, id, MaxGroups-1)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("raftnode: AddGroup: group %d: %w", id, err)
	}
	h.addMu.Lock()
	defer h.addMu.Unlock()
	select {
	case <-h.closing:
		return fmt.Errorf("raftnode: AddGroup: group %d: %w", id, ErrShutdown)
	default:
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("raftnode: AddGroup: group %d: %w", id, err)
	}
	list := h.list()
	switch n := len(list); {
	case id < n:
		return fmt.Errorf("%w: AddGroup: group %d (this host runs groups 0..%d)", ErrGroupExists, id, n-1)
	case id > n:
		return fmt.Errorf("%w: AddGroup: group %d: groups are added in order and the next one here is %d", ErrGroupOutOfRange, id, n)
	}

	g, err := h.openGroup(id, fsm)
	if err == nil {
		err = writeGroupList(h.cfg.DataDir, id+1)
	}
	if err != nil {
		if cerr := h.closeGroup(g); cerr != nil {
			h.log.Warn("raftnode: releasing a group that could not be added", "group", id, "error", cerr)
		}
		return fmt.Errorf("raftnode: AddGroup: group %d: %w", id, err)
	}
	grown := append(slices.Clip(list), g)
	h.groups.Store(&grown)
	h.log.Info("raftnode: group added", "group", id, "groups", len(grown), "last_index", g.startIndex)
	return nil
}

// closeGroup stops and releases one group that was never published (an
// AddGroup that failed half way), whatever part of it was built.
func (h *Host) closeGroup(g *group) error {
	var errs []error
	if g.raft != nil {
		if err := g.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		close(g.stopNotify)
		g.notifyDone.Wait()
	}
	if g.trans != nil {
		_ = g.trans.Close()
	}
	if g.layer != nil {
		_ = g.layer.Close()
	}
	if g.store != nil {
		if err := g.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft.db: %w", err))
		}
	}
	// A write it failed must not keep DiskError set: nothing will write
	// for this group again until it is added anew.
	h.disk.ok(failKey{g: g.id})
	h.disk.ok(failKey{g: g.id, stable: true})
	return errors.Join(errs...)
}
