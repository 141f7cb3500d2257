package raftnode

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// mountTmpfs mounts a tmpfs of the given size for the test, or skips it.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): the full-disk test needs root with mount permission", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillDir writes a file into dir until the filesystem refuses more.
func fillDir(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4096, 512} {
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = 0xa5
		}
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	return p
}

// TestFullDiskHandsAwayAndRecovers: three hosts, the third with its data dir
// on a small tmpfs the test fills while that host leads group 0. The host
// must report DiskError, lead nothing, survive elections it cannot persist a
// term for (the others move leadership around while its disk is full), and
// once the space is freed clear DiskError by itself and catch up with every
// command the others committed meanwhile.
func TestFullDiskHandsAwayAndRecovers(t *testing.T) {
	const G = 2
	mnt := mountTmpfs(t, "16m")
	fsms := make([][]*sumFSM, 3)
	hosts := make([]*Host, 3)
	for i := range hosts {
		dir := t.TempDir()
		if i == 2 {
			dir = filepath.Join(mnt, "data")
		}
		fsms[i] = newFSMs(G)
		hosts[i] = mustNew(t, Config{NodeID: "node-" + string(rune('a'+i)), DataDir: dir, BindAddr: "127.0.0.1:0", Groups: G,
			DiskCheckInterval: 100 * time.Millisecond, Logger: testLogger(t, slog.LevelWarn).With("node", i)}, fsms[i])
	}
	servers := make([]raft.Server, len(hosts))
	for i, h := range hosts {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
	}
	if err := hosts[0].BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		waitReady(t, h, 45*time.Second)
	}
	var want [G][]uint64
	next := uint64(1)
	apply := func(alive []*Host, n int) {
		t.Helper()
		for range n {
			for g := range G {
				applyRetry(t, alive, g, cmd(next), 45*time.Second)
				want[g] = append(want[g], next)
				next++
			}
		}
	}
	apply(hosts, 5)

	c := hosts[2]
	eventually(t, 30*time.Second, "node-c to lead group 0", func() bool {
		if c.Raft(0).State() == raft.Leader {
			return true
		}
		for _, h := range hosts[:2] {
			if h.Raft(0).State() == raft.Leader {
				_ = h.Raft(0).LeadershipTransferToServer(c.NodeID(), c.Addr()).Error()
			}
		}
		return false
	})
	if err := c.DiskError(); err != nil {
		t.Fatalf("DiskError before the fill: %v", err)
	}

	filler := fillDir(t, mnt)
	// A write to node-c fails, and applies move to the others.
	apply(hosts, 20)
	eventually(t, 10*time.Second, "node-c to report its disk", func() bool { return c.DiskError() != nil })
	t.Logf("node-c: %v", c.DiskError())
	if err := c.DiskError(); !strings.Contains(err.Error(), "no space left") {
		t.Errorf("DiskError does not name the cause: %v", err)
	}
	eventually(t, 30*time.Second, "node-c to lead no group", func() bool {
		return c.Raft(0).State() != raft.Leader && c.Raft(1).State() != raft.Leader
	})
	// New terms while node-c's disk is full: it must persist them or wait,
	// never take the process down.
	for g := range G {
		for range 3 {
			for _, h := range hosts[:2] {
				if h.Raft(g).State() == raft.Leader {
					other := hosts[0]
					if h == hosts[0] {
						other = hosts[1]
					}
					_ = h.Raft(g).LeadershipTransferToServer(other.NodeID(), other.Addr()).Error()
				}
			}
			apply(hosts[:2], 2)
		}
	}
	if err := c.DiskError(); err == nil {
		t.Fatal("node-c reports a writable disk while the tmpfs is full")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "node-c to clear DiskError", func() bool { return c.DiskError() == nil })
	apply(hosts, 2)
	for g := range G {
		eventually(t, 45*time.Second, "node-c to catch up", func() bool { return slices.Equal(fsms[2][g].distinct(), want[g]) })
		for i := range 2 {
			eventually(t, 45*time.Second, "replication", func() bool { return slices.Equal(fsms[i][g].distinct(), want[g]) })
		}
	}
	for _, h := range hosts {
		if err := h.Shutdown(); err != nil {
			t.Errorf("%s shutdown: %v", h.NodeID(), err)
		}
	}
}

// failingStable is a stable store whose writes fail while full is set:
// fault injection for the one path a real full disk does not reliably reach
// (a term write that finds no free page in raft.db).
type failingStable struct {
	raft.StableStore
	full atomic.Bool
}

func (f *failingStable) Set(k, v []byte) error {
	if f.full.Load() {
		return syscall.ENOSPC
	}
	return f.StableStore.Set(k, v)
}

func (f *failingStable) SetUint64(k []byte, v uint64) error {
	if f.full.Load() {
		return syscall.ENOSPC
	}
	return f.StableStore.SetUint64(k, v)
}

// TestTermWriteWaitsForTheDisk: a term/vote write the disk refuses is held
// and retried (raft would panic on the error), reported by the disk state
// meanwhile, and returns once the write succeeds.
func TestTermWriteWaitsForTheDisk(t *testing.T) {
	inner := &failingStable{StableStore: raft.NewInmemStore()}
	inner.full.Store(true)
	d := newDiskState(t.TempDir())
	var held atomic.Bool
	s := &heldStable{StableStore: inner, g: 3, disk: d, closing: make(chan struct{}), held: &held, log: testLogger(t, slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- s.SetUint64([]byte("CurrentTerm"), 7) }()
	eventually(t, 10*time.Second, "the write to be held", func() bool { return held.Load() })
	err := d.err()
	if err == nil || !strings.Contains(err.Error(), "group 3: waiting to persist its raft term/vote") {
		t.Fatalf("disk state while held: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the write returned while the disk refuses it: %v", err)
	default:
	}
	inner.full.Store(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := inner.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("term after the held write: %d %v", v, err)
	}
	if err := d.err(); err != nil {
		t.Fatalf("disk state after the write went through: %v", err)
	}
}

// TestRefusedTermWriteParksTheGroup runs real raft on three hosts whose third
// host's term/vote writes fail on demand (fault injection over its raft.db):
// an election while they fail must neither crash nor stall the group (the
// two others elect and commit), the host reports the held write, and once
// writes succeed it persists the term and catches up. A second round ends
// with Shutdown while the write is held: Shutdown must return.
func TestRefusedTermWriteParksTheGroup(t *testing.T) {
	const G = 1
	faults := map[string]*failingStable{}
	stableFaultsForTest = func(node string, g int, s raft.StableStore) raft.StableStore {
		if node != "node-c" {
			return s
		}
		f := &failingStable{StableStore: s}
		faults[node] = f
		return f
	}
	t.Cleanup(func() { stableFaultsForTest = nil })
	fsms := make([][]*sumFSM, 3)
	hosts := make([]*Host, 3)
	for i := range hosts {
		fsms[i] = newFSMs(G)
		hosts[i] = mustNew(t, Config{NodeID: "node-" + string(rune('a'+i)), DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: G,
			NoSync: true, DiskCheckInterval: 50 * time.Millisecond, Logger: testLogger(t, slog.LevelWarn).With("node", i)}, fsms[i])
	}
	servers := make([]raft.Server, len(hosts))
	for i, h := range hosts {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
	}
	if err := hosts[0].BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		waitReady(t, h, 45*time.Second)
	}
	c, fc := hosts[2], faults["node-c"]
	var want []uint64
	apply := func(alive []*Host, n int) {
		t.Helper()
		for range n {
			v := uint64(len(want) + 1)
			applyRetry(t, alive, 0, cmd(v), 45*time.Second)
			want = append(want, v)
		}
	}
	// newTerm moves group 0's leadership between node-a and node-b: a new
	// term that node-c must persist when it hears of it.
	newTerm := func() {
		t.Helper()
		eventually(t, 30*time.Second, "a leader on node-a or node-b", func() bool {
			for i, h := range hosts[:2] {
				if h.Raft(0).State() == raft.Leader {
					o := hosts[1-i]
					return h.Raft(0).LeadershipTransferToServer(o.NodeID(), o.Addr()).Error() == nil
				}
			}
			if c.Raft(0).State() == raft.Leader {
				_ = c.Raft(0).LeadershipTransferToServer(hosts[0].NodeID(), hosts[0].Addr()).Error()
			}
			return false
		})
	}
	apply(hosts, 3)

	fc.full.Store(true)
	newTerm()
	eventually(t, 30*time.Second, "node-c to hold its term write", func() bool { return c.group(0).held.Load() })
	if err := c.DiskError(); err == nil || !strings.Contains(err.Error(), "waiting to persist its raft term/vote") {
		t.Fatalf("DiskError while the term write is held: %v", err)
	}
	apply(hosts[:2], 5) // the other two carry the group
	fc.full.Store(false)
	eventually(t, 30*time.Second, "node-c to persist the term and clear DiskError", func() bool {
		return !c.group(0).held.Load() && c.DiskError() == nil
	})
	apply(hosts, 2)
	eventually(t, 45*time.Second, "node-c to catch up", func() bool { return slices.Equal(fsms[2][0].distinct(), want) })

	// Held again, then stopped: Shutdown returns instead of waiting forever.
	fc.full.Store(true)
	newTerm()
	eventually(t, 30*time.Second, "node-c to hold its term write again", func() bool { return c.group(0).held.Load() })
	done := make(chan error, 1)
	go func() { done <- c.Shutdown() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Shutdown of a host whose group waits for the disk did not return")
	}
	apply(hosts[:2], 2)
}
