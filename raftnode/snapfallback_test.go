package raftnode

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestSnapshotFallback: a node's newest snapshot is unreadable (its state
// file damaged: what a power cut could leave if the snapshot directory's
// own entries were lost, or a bad disk), the log still reaching back to
// the snapshot before it. On restart raft skips the damaged snapshot
// (its CRC does not match), restores the older one and replays the log
// from there: the FSM holds every applied value, in order, and the group
// takes writes again. This is why a group keeps two snapshots
// (DefaultSnapshotRetain), and it holds only while TrailingLogs covers the
// entries between them (docs/testing.md, "Outside the power-cut layer").
func TestSnapshotFallback(t *testing.T) {
	port, err := powerPorts.Pick()
	if err != nil {
		t.Fatal(err)
	}
	trailing := uint64(1000) // more than the 45 entries between the snapshots and after
	if v := os.Getenv("TOLLGATE_SNAPFALLBACK_TRAILING"); v != "" {
		// Fewer than that: the log no longer reaches the older snapshot.
		// raft then fails applying the entries it lacks (it panics), so
		// this is for a run by hand, not for the suite.
		if _, err := fmt.Sscan(v, &trailing); err != nil {
			t.Fatalf("TOLLGATE_SNAPFALLBACK_TRAILING=%q: %v", v, err)
		}
	}
	cfg := Config{NodeID: "node-1", DataDir: t.TempDir(), BindAddr: fmt.Sprintf("127.0.0.1:%d", port), Groups: 1, NoSync: true,
		SnapshotThreshold: 1 << 20, TrailingLogs: trailing, Logger: testLogger(t, slog.LevelWarn)}
	fsms := newFSMs(1)
	h := mustNew(t, cfg, fsms)
	if err := h.BootstrapCluster([]raft.Server{{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, 30*time.Second)
	var want []uint64
	apply := func(h *Host, n int) {
		for range n {
			v := uint64(len(want) + 1)
			applyRetry(t, []*Host{h}, 0, cmd(v), 30*time.Second)
			want = append(want, v)
		}
	}
	apply(h, 20)
	if err := h.Raft(0).Snapshot().Error(); err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	apply(h, 20)
	if err := h.Raft(0).Snapshot().Error(); err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	apply(h, 5)
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// Damage the newest snapshot's state file (one byte: its CRC fails).
	snapDir := filepath.Join(cfg.DataDir, "group-0")
	store, err := raft.NewFileSnapshotStore(snapDir, DefaultSnapshotRetain, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := store.List()
	if err != nil || len(metas) != 2 {
		t.Fatalf("%d snapshots (%v), want 2", len(metas), err)
	}
	state := filepath.Join(snapDir, "snapshots", metas[0].ID, "state.bin")
	b, err := os.ReadFile(state)
	if err != nil || len(b) == 0 {
		t.Fatalf("read %s: %d bytes, %v", state, len(b), err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(state, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("damaged %s (index %d); the older snapshot is at index %d", state, metas[0].Index, metas[1].Index)

	fsms = newFSMs(1)
	h = mustNew(t, cfg, fsms)
	waitReady(t, h, 30*time.Second)
	eventually(t, 30*time.Second, "the FSM to hold every applied value", func() bool {
		return slices.Equal(fsms[0].values(), want)
	})
	if fsms[0].restoreCount() == 0 {
		t.Error("the FSM was not restored from a snapshot")
	}
	apply(h, 3)
	eventually(t, 30*time.Second, "the FSM to take new writes", func() bool {
		return slices.Equal(fsms[0].values(), want)
	})
}
