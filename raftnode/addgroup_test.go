package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// TestAddGroup runs three hosts on real loopback TCP with G = 2 and adds
// group 2 at runtime: on two hosts first, bootstrapped with all three as
// voters, while the third is restarted before it adds the group (it must
// catch up once it does); then the leader of group 2 is restarted from its
// data dir with Config.Groups still 2 and must bring group 2 back with its
// entries and a leader.
func TestAddGroup(t *testing.T) {
	const G, N = 2, 3
	type node struct {
		cfg     Config
		fsms    []*sumFSM
		h       *Host
		leaders *leaderLog
	}
	nodes := make([]*node, N)
	start := func(n *node) {
		t.Helper()
		n.fsms = newFSMs(G + 1) // room for group 2, which New opens once it is listed
		h, err := New(n.cfg, fsmFor(n.fsms))
		if err != nil {
			t.Fatalf("%s: %v", n.cfg.NodeID, err)
		}
		t.Cleanup(func() { _ = h.Shutdown() })
		n.h = h
	}
	for i := range nodes {
		// A restarted host must come back on its address: the groups'
		// configurations name it.
		port, err := powerPorts.Pick()
		if err != nil {
			t.Fatal(err)
		}
		n := &node{leaders: &leaderLog{}}
		n.cfg = Config{NodeID: fmt.Sprintf("node-%c", 'a'+i), DataDir: t.TempDir(), BindAddr: fmt.Sprintf("127.0.0.1:%d", port),
			Groups: G, NoSync: true, LeaderNotify: n.leaders.notify, Logger: testLogger(t, slog.LevelWarn).With("node", i)}
		nodes[i] = n
		start(n)
	}
	hosts := func(g int) []*Host { // those running group g
		var hs []*Host
		for _, n := range nodes {
			if n.h.Groups() > g {
				hs = append(hs, n.h)
			}
		}
		return hs
	}
	servers := make([]raft.Server, N)
	for i, n := range nodes {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: n.h.NodeID(), Address: n.h.Addr()}
	}
	if err := nodes[1].h.BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		waitReady(t, n.h, 45*time.Second)
	}
	var want [G + 1][]uint64
	apply := func(g int, v uint64) {
		t.Helper()
		applyRetry(t, hosts(g), g, cmd(v), 45*time.Second)
		want[g] = append(want[g], v)
	}
	converged := func(g int, ns ...*node) {
		t.Helper()
		// Every value applied once or, retried, twice (sumFSM.distinct),
		// and the same log on every node.
		for _, n := range ns {
			eventually(t, 45*time.Second, fmt.Sprintf("%s group %d to hold %d entries", n.cfg.NodeID, g, len(want[g])), func() bool {
				return slices.Equal(n.fsms[g].distinct(), want[g]) && slices.Equal(n.fsms[g].values(), ns[0].fsms[g].values())
			})
		}
	}
	for g := range G {
		apply(g, uint64(g)*1000)
	}

	ctx := context.Background()
	a, b, c := nodes[0], nodes[1], nodes[2]
	for _, n := range []*node{a, b} {
		if err := n.h.AddGroup(ctx, 2, n.fsms[2]); err != nil {
			t.Fatalf("%s: AddGroup(2): %v", n.cfg.NodeID, err)
		}
		if got := n.h.Groups(); got != G+1 {
			t.Fatalf("%s: Groups() = %d after AddGroup, want %d", n.cfg.NodeID, got, G+1)
		}
		// Every voter may bootstrap with the identical configuration.
		if err := n.h.BootstrapGroup(2, servers); err != nil {
			t.Fatalf("%s: BootstrapGroup(2): %v", n.cfg.NodeID, err)
		}
	}

	// c restarts before it has group 2: it opens only the boot groups.
	if err := c.h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	start(c)
	if got := c.h.Groups(); got != G {
		t.Fatalf("node-c restarted before AddGroup: Groups() = %d, want %d", got, G)
	}
	waitReady(t, c.h, 45*time.Second)

	// a and b are a quorum of group 2's three voters.
	for i := range 10 {
		apply(2, 2000+uint64(i))
	}
	converged(2, a, b)

	if err := c.h.AddGroup(ctx, 2, c.fsms[2]); err != nil {
		t.Fatalf("node-c: AddGroup(2) after its restart: %v", err)
	}
	converged(2, a, b, c)
	for g := range G {
		apply(g, uint64(g)*1000+1) // the boot groups carry on beside it
		converged(g, a, b, c)
	}

	// Bad ids, on a host that runs groups 0..2.
	for _, tc := range []struct {
		id   int
		want error
		says string
	}{
		{2, ErrGroupExists, "group 2"},
		{0, ErrGroupExists, "group 0"},
		{4, ErrGroupOutOfRange, "next one here is 3"},
		{-1, ErrGroupOutOfRange, "group -1"},
		{MaxGroups, ErrGroupOutOfRange, fmt.Sprintf("group %d", MaxGroups)},
	} {
		err := a.h.AddGroup(ctx, tc.id, &sumFSM{})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("AddGroup(%d) = %v, want %v naming %q", tc.id, err, tc.want, tc.says)
		}
	}
	if err := a.h.AddGroup(ctx, 3, nil); err == nil || !strings.Contains(err.Error(), "fsm is nil") {
		t.Errorf("AddGroup with a nil FSM = %v, want an error naming the fsm", err)
	}
	if got := a.h.Groups(); got != G+1 {
		t.Fatalf("Groups() = %d after refused AddGroups, want %d", got, G+1)
	}

	// Whoever leads group 2 heard of it through LeaderNotify.
	var leader *node
	eventually(t, 45*time.Second, "a leader of group 2", func() bool {
		for _, n := range nodes {
			if n.h.Raft(2).State() == raft.Leader {
				leader = n
				return true
			}
		}
		return false
	})
	eventually(t, 10*time.Second, "LeaderNotify for group 2", func() bool {
		ev := leader.leaders.get(2)
		return len(ev) > 0 && ev[len(ev)-1]
	})

	// Restart group 2's leader: Config.Groups still says 2, the group
	// list brings group 2 back with every entry, and it elects again.
	if err := leader.h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if ev := leader.leaders.get(2); ev[len(ev)-1] {
		t.Fatalf("%s: no final LeaderNotify(2, false) on Shutdown: %v", leader.cfg.NodeID, ev)
	}
	if n, err := ListedGroups(leader.cfg.DataDir); err != nil || n != G+1 {
		t.Fatalf("%s: ListedGroups = %d, %v; want %d", leader.cfg.NodeID, n, err, G+1)
	}
	start(leader)
	if got := leader.h.Groups(); got != G+1 {
		t.Fatalf("%s restarted: Groups() = %d, want %d", leader.cfg.NodeID, got, G+1)
	}
	waitReady(t, leader.h, 45*time.Second) // a leader known for group 2 and its log applied
	if got := leader.fsms[2].distinct(); !slices.Equal(got, want[2]) {
		t.Fatalf("%s restarted: group 2 holds %v, want %v", leader.cfg.NodeID, got, want[2])
	}
	for i := range 5 {
		apply(2, 3000+uint64(i))
	}
	converged(2, a, b, c)

	// A host that is shutting down refuses.
	if err := b.h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := b.h.AddGroup(ctx, 3, &sumFSM{}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("AddGroup on a shut down host = %v, want ErrShutdown", err)
	}
}

// TestAddGroupSingleNode: on a single-node host (Bootstrap set) an added
// group bootstraps itself; after a crash that lost the group list (the
// group was opened but not yet recorded) the host starts without it and a
// second AddGroup takes the group's state back from its directory and the
// shared log.
func TestAddGroupSingleNode(t *testing.T) {
	cfg := Config{NodeID: "n1", DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: 1, Bootstrap: true,
		Logger: testLogger(t, slog.LevelWarn)}
	fs := newFSMs(2)
	h := mustNew(t, cfg, fs)
	waitReady(t, h, 30*time.Second)
	if err := h.AddGroup(context.Background(), 1, fs[1]); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, 30*time.Second) // now includes group 1
	var want []uint64
	for i := range 20 {
		applyRetry(t, []*Host{h}, 1, cmd(uint64(i)), 30*time.Second)
		want = append(want, uint64(i))
	}
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(groupListPath(cfg.DataDir)); err != nil {
		t.Fatal(err)
	}

	fs = newFSMs(2)
	h = mustNew(t, cfg, fs)
	if got := h.Groups(); got != 1 {
		t.Fatalf("Groups() = %d without a group list, want 1", got)
	}
	if err := h.AddGroup(context.Background(), 1, fs[1]); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, 30*time.Second)
	if got := fs[1].values(); !slices.Equal(got, want) {
		t.Fatalf("group 1 added again over its old state: %v, want %v", got, want)
	}
	if r := h.Raft(1); r.State() != raft.Leader {
		eventually(t, 30*time.Second, "group 1 leader", func() bool { return r.State() == raft.Leader })
	}
}

// TestAddGroupConcurrentReaders adds groups while other goroutines read the
// group list the way the server does (run with -race).
func TestAddGroupConcurrentReaders(t *testing.T) {
	const added = 3
	cfg := Config{NodeID: "n1", DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: 1, Bootstrap: true,
		Logger: testLogger(t, slog.LevelWarn)}
	fs := newFSMs(1 + added)
	h := mustNew(t, cfg, fs)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads [3]atomic.Int64
	for r := range reads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for g := range h.Groups() {
					switch r {
					case 0:
						_ = h.Raft(g).State()
					case 1:
						_ = h.GroupLoaded(g)
					case 2:
						_ = h.Loaded()
					}
				}
				reads[r].Add(1)
			}
		}()
	}
	var errs [added]error
	var adders sync.WaitGroup
	for i := range added {
		adders.Add(1)
		go func() { // racing adders: exactly one may add each id
			defer adders.Done()
			for id := 1; id <= added; id++ {
				if err := h.AddGroup(context.Background(), id, fs[id]); err != nil && !errors.Is(err, ErrGroupExists) && !errors.Is(err, ErrGroupOutOfRange) {
					errs[i] = err
				}
			}
		}()
	}
	adders.Wait()
	// The adds can all finish before a reader goroutine is first scheduled
	// (seen on a quiet machine: 0.04 s): let every reader read at least
	// once, with the groups added, before stopping them.
	eventually(t, 10*time.Second, "every reader to read", func() bool {
		return reads[0].Load() > 0 && reads[1].Load() > 0 && reads[2].Load() > 0
	})
	close(stop)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := h.Groups(); got != 1+added {
		t.Fatalf("Groups() = %d, want %d", got, 1+added)
	}
	for r := range reads {
		if reads[r].Load() == 0 {
			t.Fatalf("reader %d never read", r)
		}
	}
	waitReady(t, h, 30*time.Second)
	for g := range 1 + added {
		applyRetry(t, []*Host{h}, g, cmd(uint64(g)), 30*time.Second)
		if got := fs[g].values(); !slices.Equal(got, []uint64{uint64(g)}) {
			t.Fatalf("group %d: %v", g, got)
		}
	}
}

// TestGroupList checks the group list's byte format: it round-trips, every
// flipped byte and every truncation is caught, and New refuses a data dir
// whose list is damaged, naming the file.
func TestGroupList(t *testing.T) {
	for _, n := range []int{1, 2, 300, MaxGroups} {
		got, err := decodeGroupList(encodeGroupList(n))
		if err != nil || got != n {
			t.Fatalf("round trip of %d: %d, %v", n, got, err)
		}
	}
	good := encodeGroupList(3)
	for i := range good {
		for _, bit := range []byte{0x01, 0x80} {
			b := slices.Clone(good)
			b[i] ^= bit
			if n, err := decodeGroupList(b); err == nil {
				t.Fatalf("byte %d bit %02x flipped: decoded %d", i, bit, n)
			}
		}
	}
	for l := range len(good) {
		if _, err := decodeGroupList(good[:l]); err == nil {
			t.Fatalf("truncated to %d bytes: decoded", l)
		}
	}
	if _, err := decodeGroupList(append(slices.Clone(good), 0)); err == nil {
		t.Fatal("one byte too long: decoded")
	}
	for _, n := range []int{0, MaxGroups + 1} { // well-formed but impossible counts
		if _, err := decodeGroupList(encodeGroupList(n)); err == nil {
			t.Fatalf("count %d decoded", n)
		}
	}

	dir := t.TempDir()
	if n, err := ListedGroups(dir); n != 0 || err != nil {
		t.Fatalf("no list: %d, %v", n, err)
	}
	if err := writeGroupList(dir, 5); err != nil {
		t.Fatal(err)
	}
	if n, err := ListedGroups(dir); n != 5 || err != nil {
		t.Fatalf("written 5: %d, %v", n, err)
	}
	b, _ := os.ReadFile(groupListPath(dir))
	b[13] ^= 0xff
	if err := os.WriteFile(groupListPath(dir), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := HasState(dir, 1); !errors.Is(err, ErrGroupListCorrupt) {
		t.Fatalf("HasState over a damaged group list = %v, want ErrGroupListCorrupt", err)
	}
	_, err := New(Config{NodeID: "n1", DataDir: dir, BindAddr: "127.0.0.1:0", Groups: 1, Logger: testLogger(t, slog.LevelError)}, fsmFor(newFSMs(8)))
	if !errors.Is(err, ErrGroupListCorrupt) || !strings.Contains(err.Error(), groupListPath(dir)) {
		t.Fatalf("New over a damaged group list = %v, want ErrGroupListCorrupt naming %s", err, groupListPath(dir))
	}
}

// TestAddGroupIdleCost counts the goroutines of idle single-node hosts:
// what one boot group costs (G = 3 against G = 2) and what a group added at
// runtime costs (G = 2 plus AddGroup). They must be the same: AddGroup
// starts nothing per existing group. The figures are logged (BENCHMARKS.md).
func TestAddGroupIdleCost(t *testing.T) {
	idle := func(groups, add int) int {
		t.Helper()
		fs := newFSMs(groups + add)
		h := mustNew(t, Config{NodeID: "n1", DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: groups, Bootstrap: true,
			Logger: testLogger(t, slog.LevelWarn)}, fs)
		for g := groups; g < groups+add; g++ {
			if err := h.AddGroup(context.Background(), g, fs[g]); err != nil {
				t.Fatal(err)
			}
		}
		waitReady(t, h, 30*time.Second)
		n := settledGoroutines()
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := settledGoroutines()
	g2 := idle(2, 0) - base
	g3 := idle(3, 0) - base
	g2plus1 := idle(2, 1) - base
	g2plus2 := idle(2, 2) - base
	g4 := idle(4, 0) - base
	t.Logf("idle goroutines of a single-node host: G=2 %d, G=3 %d, G=4 %d, G=2+AddGroup %d, G=2+2×AddGroup %d; per boot group %d, per added group %d",
		g2, g3, g4, g2plus1, g2plus2, g3-g2, g2plus1-g2)
	if g2plus1 != g3 || g2plus2 != g4 {
		t.Fatalf("a group added at runtime costs %d goroutines (G=2+1: %d, G=2+2: %d), a boot group %d (G=3: %d, G=4: %d)",
			g2plus1-g2, g2plus1, g2plus2, g3-g2, g3, g4)
	}
}

// settledGoroutines is the goroutine count once it reads the same five
// times in a row (goroutines of a host just shut down take a moment to
// exit; an idle single-node host starts none on its own).
func settledGoroutines() int {
	last, same := -1, 0
	for same < 5 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// BenchmarkAddGroup: the time AddGroup takes on an idle single-node host
// with a durable log (each adds the next group: raft.db created and synced,
// the group list written and synced). Run with -benchtime Nx, N small: every
// group added stays running until the host shuts down.
func BenchmarkAddGroup(b *testing.B) {
	h, err := New(Config{NodeID: "n1", DataDir: b.TempDir(), BindAddr: "127.0.0.1:0", Groups: 1,
		Logger: slog.New(slog.DiscardHandler)}, fsmFor(newFSMs(1)))
	if err != nil {
		b.Fatal(err)
	}
	defer h.Shutdown()
	b.ResetTimer()
	for i := range b.N {
		if err := h.AddGroup(context.Background(), 1+i, &sumFSM{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRaftLookup: Host.Raft(g), which request paths call, reads the
// group list through an atomic pointer since AddGroup.
func BenchmarkRaftLookup(b *testing.B) {
	h, err := New(Config{NodeID: "n1", DataDir: b.TempDir(), BindAddr: "127.0.0.1:0", Groups: 4, NoSync: true,
		Logger: slog.New(slog.DiscardHandler)}, fsmFor(newFSMs(4)))
	if err != nil {
		b.Fatal(err)
	}
	defer h.Shutdown()
	b.ResetTimer()
	var r *raft.Raft
	for i := range b.N {
		r = h.Raft(i & 3)
	}
	_ = r
}

// TestAddGroupFailureReleasesTheGroup: an AddGroup that fails half way
// (raft.db locked by someone else; the group list not writable after the
// group's raft started) leaves the host as it was, and the same id can be
// added once the cause is gone (its port layer and stores were released).
func TestAddGroupFailureReleasesTheGroup(t *testing.T) {
	defer func(d time.Duration) { boltOpenTimeout = d }(boltOpenTimeout)
	boltOpenTimeout = 100 * time.Millisecond
	cfg := Config{NodeID: "n1", DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: 1, Bootstrap: true,
		Logger: testLogger(t, slog.LevelError)}
	fs := newFSMs(2)
	h := mustNew(t, cfg, fs)
	ctx := context.Background()

	// raft.db held by another open: the build fails before raft starts.
	dir := groupDir(cfg.DataDir, 1)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(filepath.Join(dir, "raft.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddGroup(ctx, 1, fs[1]); err == nil || !strings.Contains(err.Error(), "raft.db") {
		t.Fatalf("AddGroup with raft.db locked = %v, want the raft.db error", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// The group list cannot be replaced (its temporary name is taken by a
	// directory): the group's raft ran and is stopped again.
	tmp := groupListPath(cfg.DataDir) + ".tmp"
	if err := os.Mkdir(tmp, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := h.AddGroup(ctx, 1, fs[1]); err == nil || !strings.Contains(err.Error(), "group list") {
		t.Fatalf("AddGroup with the group list unwritable = %v, want the group list error", err)
	}
	if got := h.Groups(); got != 1 {
		t.Fatalf("Groups() = %d after failed AddGroups, want 1", got)
	}
	if n, err := ListedGroups(cfg.DataDir); n != 0 || err != nil {
		t.Fatalf("ListedGroups = %d, %v after failed AddGroups, want none", n, err)
	}
	if err := h.DiskError(); err != nil {
		t.Fatalf("DiskError after failed AddGroups: %v", err)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}

	if err := h.AddGroup(ctx, 1, fs[1]); err != nil {
		t.Fatalf("AddGroup once the causes are gone: %v", err)
	}
	waitReady(t, h, 30*time.Second)
	applyRetry(t, []*Host{h}, 1, cmd(7), 30*time.Second)
	if got := fs[1].values(); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("group 1: %v", got)
	}
}

// TestRecordGroups: recording raises the listed count, never lowers it, and
// refuses a count out of range.
func TestRecordGroups(t *testing.T) {
	dir := t.TempDir()
	if err := RecordGroups(dir, 8); err != nil {
		t.Fatal(err)
	}
	if err := RecordGroups(dir, 4); err != nil {
		t.Fatal(err)
	}
	if n, err := ListedGroups(dir); err != nil || n != 8 {
		t.Fatalf("listed %d (%v) after recording 8 then 4, want 8", n, err)
	}
	if err := RecordGroups(dir, 0); err == nil {
		t.Fatal("recording 0 groups was accepted")
	}
}
