package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// snapFallbackNode runs a single-node group that takes two snapshots,
// `between` entries apart, and a few entries more, stops it and damages its
// newest snapshot (damage: "state" flips the state file's last byte, so its
// CRC fails: what a bad disk or a power cut that lost the snapshot
// directory's own entries could leave; "meta" truncates meta.json, so raft
// does not even list it). It returns the config to restart with, the values
// applied, the damaged path and the older snapshot's index.
func snapFallbackNode(t *testing.T, trailing uint64, between int, damage string) (cfg Config, want []uint64, damaged string, olderIndex uint64) {
	t.Helper()
	port, err := powerPorts.Pick()
	if err != nil {
		t.Fatal(err)
	}
	cfg = Config{NodeID: "node-1", DataDir: t.TempDir(), BindAddr: fmt.Sprintf("127.0.0.1:%d", port), Groups: 1, NoSync: true,
		SnapshotThreshold: 1 << 20, TrailingLogs: trailing, Logger: testLogger(t, slog.LevelWarn)}
	fsms := newFSMs(1)
	h := mustNew(t, cfg, fsms)
	if err := h.BootstrapCluster([]raft.Server{{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, 30*time.Second)
	// Applied back to back from one goroutine (raft keeps their order) and
	// awaited at the end: thousands of entries, one commit wait.
	apply := func(n int) {
		var last raft.ApplyFuture
		for range n {
			v := uint64(len(want) + 1)
			last = h.Raft(0).Apply(cmd(v), 30*time.Second)
			want = append(want, v)
		}
		if err := last.Error(); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	apply(20)
	if err := h.Raft(0).Snapshot().Error(); err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	apply(between)
	if err := h.Raft(0).Snapshot().Error(); err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	apply(5)
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}

	snapDir := filepath.Join(cfg.DataDir, "group-0")
	store, err := raft.NewFileSnapshotStore(snapDir, DefaultSnapshotRetain, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := store.List()
	if err != nil || len(metas) != 2 {
		t.Fatalf("%d snapshots (%v), want 2", len(metas), err)
	}
	switch damage {
	case "state":
		damaged = filepath.Join(snapDir, "snapshots", metas[0].ID, "state.bin")
		b, err := os.ReadFile(damaged)
		if err != nil || len(b) == 0 {
			t.Fatalf("read %s: %d bytes, %v", damaged, len(b), err)
		}
		b[len(b)-1] ^= 0xff
		if err := os.WriteFile(damaged, b, 0o600); err != nil {
			t.Fatal(err)
		}
	case "meta":
		damaged = filepath.Join(snapDir, "snapshots", metas[0].ID)
		if err := os.Truncate(filepath.Join(damaged, "meta.json"), 7); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("damage %q", damage)
	}
	t.Logf("damaged %s (index %d); the older snapshot is at index %d", damaged, metas[0].Index, metas[1].Index)
	return cfg, want, damaged, metas[1].Index
}

// TestSnapshotFallback: a node's newest snapshot is unreadable, the log
// still reaching back to the snapshot before it. On restart raft skips the
// damaged snapshot (its CRC does not match), restores the older one and
// replays the log from there: the FSM holds every applied value, in order,
// and the group takes writes again. This is why a group keeps two
// snapshots (DefaultSnapshotRetain), and it holds only while the log covers
// the entries between them (TestSnapshotCorruptRefused for when it does
// not).
func TestSnapshotFallback(t *testing.T) {
	cfg, want, _, _ := snapFallbackNode(t, 1000, 20, "state") // 1000 > the 45 entries between the snapshots and after

	fsms := newFSMs(1)
	h := mustNew(t, cfg, fsms)
	waitReady(t, h, 30*time.Second)
	eventually(t, 30*time.Second, "the FSM to hold every applied value", func() bool {
		return slices.Equal(fsms[0].values(), want)
	})
	if fsms[0].restoreCount() == 0 {
		t.Error("the FSM was not restored from a snapshot")
	}
	for range 3 {
		v := uint64(len(want) + 1)
		applyRetry(t, []*Host{h}, 0, cmd(v), 30*time.Second)
		want = append(want, v)
	}
	eventually(t, 30*time.Second, "the FSM to take new writes", func() bool {
		return slices.Equal(fsms[0].values(), want)
	})
}

// TestSnapshotCorruptRefused: with the default TrailingLogs (2,048) and
// more entries than that between the two snapshots, as the default
// SnapshotThreshold (4,096) makes them, the log no longer reaches the older
// snapshot. Unchecked, raft restores the older one and panics on the first
// entry it lacks (and the node crash-loops); New must refuse the group
// instead with ErrSnapshotCorrupt, naming the group, the damaged file, the
// log gap and the remedy. The restart runs in a child process, so that a
// panic fails this test instead of killing the test binary.
func TestSnapshotCorruptRefused(t *testing.T) {
	for _, damage := range []string{"state", "meta"} {
		t.Run(damage, func(t *testing.T) {
			cfg, _, damaged, older := snapFallbackNode(t, 0, DefaultTrailingLogs+60, damage)
			if cfg.TrailingLogs != 0 {
				t.Fatalf("TrailingLogs %d, want the default", cfg.TrailingLogs)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestSnapshotCorruptChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "TOLLGATE_SNAPCHILD_DIR="+cfg.DataDir, "TOLLGATE_SNAPCHILD_ADDR="+cfg.BindAddr)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("restart (child process) failed: %v\n%s", err, out)
			}
			got := string(out)
			for _, s := range []string{"REFUSED", "group 0:", damaged, fmt.Sprintf("index %d", older),
				"wipe its data dir", "Replace a node that lost its disk", "snapshot restore --offline"} {
				if !strings.Contains(got, s) {
					t.Errorf("child output lacks %q:\n%s", s, got)
				}
			}
		})
	}
}

// TestSnapshotCorruptChild is TestSnapshotCorruptRefused's child process:
// it restarts the damaged node and prints REFUSED and the error if New
// refuses it with ErrSnapshotCorrupt. If New opened the group, it waits
// for the group to apply its log (where raft would panic) and fails.
func TestSnapshotCorruptChild(t *testing.T) {
	dir := os.Getenv("TOLLGATE_SNAPCHILD_DIR")
	if dir == "" {
		t.Skip("child process of TestSnapshotCorruptRefused only")
	}
	cfg := Config{NodeID: "node-1", DataDir: dir, BindAddr: os.Getenv("TOLLGATE_SNAPCHILD_ADDR"), Groups: 1, NoSync: true,
		SnapshotThreshold: 1 << 20, Logger: testLogger(t, slog.LevelWarn)}
	fsms := newFSMs(1)
	h, err := New(cfg, fsmFor(fsms))
	if err != nil {
		if !errors.Is(err, ErrSnapshotCorrupt) {
			t.Fatalf("New: %v, want ErrSnapshotCorrupt", err)
		}
		cg := CorruptGroups(err)
		if len(cg) != 1 || cg[0].Group != 0 || cg[0].Path == "" || !strings.Contains(err.Error(), cg[0].Path) {
			t.Fatalf("CorruptGroups = %+v, want group 0 with the damaged path named in %v", cg, err)
		}
		fmt.Printf("REFUSED: %v\n", err)
		return
	}
	defer func() { _ = h.Shutdown() }()
	waitReady(t, h, 30*time.Second)
	eventually(t, 30*time.Second, "the group to apply its log", func() bool { return len(fsms[0].values()) > 0 })
	t.Fatalf("New opened a group whose log does not reach its readable snapshot (FSM holds %d values)", len(fsms[0].values()))
}

// TestCheckedSnapshotsOpen: the snapshot checkSnapshots verified is served
// once, byte for byte what raft's FileSnapshotStore wrote, without a second
// CRC pass; any later Open goes through the store (and its CRC check
// again), so a file damaged after the start is still caught.
func TestCheckedSnapshotsOpen(t *testing.T) {
	dir := t.TempDir()
	store, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := store.Create(raft.SnapshotVersionMax, 10, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("the state of group 0")
	if _, err := sink.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	logs := raft.NewInmemStore()
	ours, err := newSnapStore(dir, 2, nil, nil) // reading what raft's store wrote
	if err != nil {
		t.Fatal(err)
	}
	verified, err := checkSnapshots(0, ours, logs)
	if err != nil || verified == nil || verified.Index != 10 {
		t.Fatalf("checkSnapshots = %+v, %v; want the snapshot at index 10", verified, err)
	}
	cs := &checkedSnapshots{snapStore: ours, verified: verified}
	read := func() ([]byte, error) {
		_, rc, err := cs.Open(verified.ID)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	if got, err := read(); err != nil || string(got) != string(payload) {
		t.Fatalf("first Open: %q, %v; want %q", got, err, payload)
	}
	state := filepath.Join(dir, "snapshots", verified.ID, "state.bin")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if err := os.WriteFile(state, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := read(); err == nil {
		t.Fatalf("second Open of a damaged file: %q, want the store's CRC error", got)
	}
}
