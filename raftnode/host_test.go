package raftnode

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// leaderLog records LeaderNotify calls.
type leaderLog struct {
	mu     sync.Mutex
	events map[int][]bool
}

func (l *leaderLog) notify(g int, v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = make(map[int][]bool)
	}
	l.events[g] = append(l.events[g], v)
}

func (l *leaderLog) get(g int) []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events[g])
}

func waitReady(t *testing.T, h *Host, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := h.WaitReady(ctx); err != nil {
		t.Fatalf("%s: %v", h.NodeID(), err)
	}
}

func mustNew(t *testing.T, cfg Config, fs []*sumFSM) *Host {
	t.Helper()
	h, err := New(cfg, fsmFor(fs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Shutdown() })
	return h
}

func TestConfigValidate(t *testing.T) {
	c := Config{NodeID: "n1", DataDir: "/tmp/x", BindAddr: "127.0.0.1:0"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Groups != DefaultGroups || c.HeartbeatTimeout != DefaultHeartbeatTimeout ||
		c.ElectionTimeout != DefaultElectionTimeout || c.LeaderLeaseTimeout != DefaultLeaderLeaseTimeout ||
		c.CommitTimeout != DefaultCommitTimeout || c.MaxAppendEntries != DefaultMaxAppendEntries ||
		c.SnapshotInterval != DefaultSnapshotInterval || c.SnapshotThreshold != DefaultSnapshotThreshold ||
		c.TrailingLogs != DefaultTrailingLogs || c.SnapshotRetain != DefaultSnapshotRetain ||
		c.TransportTimeout != DefaultTransportTimeout || c.TransportMaxPool != DefaultTransportMaxPool ||
		c.HandshakeTimeout != DefaultHandshakeTimeout || c.Logger == nil || c.RaftLogLevel == nil {
		t.Fatalf("defaults not filled: %+v", c)
	}

	serverTLS, _ := testCerts(t)
	bad := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no node id", func(c *Config) { c.NodeID = "" }, "NodeID"},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "DataDir"},
		{"no bind", func(c *Config) { c.BindAddr = "" }, "BindAddr"},
		{"bad bind", func(c *Config) { c.BindAddr = "localhost" }, "BindAddr"},
		{"unspecified advertise", func(c *Config) { c.AdvertiseAddr = "0.0.0.0:7301" }, "AdvertiseAddr"},
		{"advertise port 0", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:0" }, "AdvertiseAddr"},
		{"groups", func(c *Config) { c.Groups = -1 }, "Groups"},
		{"too many groups", func(c *Config) { c.Groups = MaxGroups + 1 }, "Groups"},
		{"election < heartbeat", func(c *Config) { c.ElectionTimeout = 100 * time.Millisecond }, "ElectionTimeout"},
		{"lease > heartbeat", func(c *Config) { c.LeaderLeaseTimeout = time.Second }, "LeaderLeaseTimeout"},
		{"commit", func(c *Config) { c.CommitTimeout = time.Microsecond }, "CommitTimeout"},
		{"max append", func(c *Config) { c.MaxAppendEntries = 5000 }, "MaxAppendEntries"},
		{"retain", func(c *Config) { c.SnapshotRetain = -1 }, "SnapshotRetain"},
		{"half tls", func(c *Config) { c.ServerTLS = serverTLS }, "TLS"},
	}
	for _, tc := range bad {
		c := Config{NodeID: "n1", DataDir: "/tmp/x", BindAddr: "127.0.0.1:0"}
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want error mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(Config{NodeID: "n"}, nil); err == nil {
		t.Error("New with nil fsmFor succeeded")
	}
}

// TestSingleNodeRestart: one node, G=4, Bootstrap. Every group elects this
// node; applies work; after Shutdown and New on the same DataDir the FSMs
// hold exactly the same values, recovered by log replay only or by
// snapshot + log replay (with the snapshotted prefix compacted away).
func TestSingleNodeRestart(t *testing.T) {
	for _, snapshot := range []bool{false, true} {
		name := "log-replay"
		if snapshot {
			name = "snapshot+log-replay"
		}
		t.Run(name, func(t *testing.T) {
			const G, before, after = 4, 30, 20
			cfg := Config{
				NodeID:    "n1",
				DataDir:   t.TempDir(),
				BindAddr:  "127.0.0.1:0",
				Groups:    G,
				Bootstrap: true,
				Logger:    testLogger(t, slog.LevelWarn),
			}
			if snapshot {
				cfg.TrailingLogs = 5 // compact most of the log after the snapshot
			}
			var leaders leaderLog
			cfg.LeaderNotify = leaders.notify

			fs := newFSMs(G)
			h := mustNew(t, cfg, fs)
			waitReady(t, h, 30*time.Second)
			if h.Groups() != G {
				t.Fatalf("Groups() = %d", h.Groups())
			}
			want := make([][]uint64, G)
			apply := func(h *Host, g int, v uint64) {
				t.Helper()
				f := h.Raft(g).Apply(cmd(v), 5*time.Second)
				if err := f.Error(); err != nil {
					t.Fatalf("group %d apply: %v", g, err)
				}
				want[g] = append(want[g], v)
				var sum uint64
				for _, x := range want[g] {
					sum += x
				}
				if got := f.Response(); got != sum {
					t.Fatalf("group %d: response %v, want sum %d", g, got, sum)
				}
			}
			for g := 0; g < G; g++ {
				r := h.Raft(g)
				if r.State() != raft.Leader {
					t.Fatalf("group %d: state %v, want Leader", g, r.State())
				}
				if addr, id := r.LeaderWithID(); addr != h.Addr() || id != h.NodeID() {
					t.Fatalf("group %d: leader %s/%s, want %s/%s", g, addr, id, h.Addr(), h.NodeID())
				}
				for i := 0; i < before; i++ {
					apply(h, g, uint64(g)*1_000_000+uint64(i))
				}
				if snapshot {
					if err := r.Snapshot().Error(); err != nil {
						t.Fatalf("group %d snapshot: %v", g, err)
					}
				}
				for i := before; i < before+after; i++ {
					apply(h, g, uint64(g)*1_000_000+uint64(i))
				}
			}
			// Followers of nothing: the leader applies synchronously before the
			// future resolves, so the FSMs are exact now.
			for g := 0; g < G; g++ {
				if got := fs[g].distinct(); !slices.Equal(got, want[g]) {
					t.Fatalf("group %d before restart: %v, want %v", g, got, want[g])
				}
			}
			if err := h.Shutdown(); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			if err := h.Shutdown(); err != nil {
				t.Fatalf("second shutdown: %v", err)
			}
			for g := 0; g < G; g++ {
				ev := leaders.get(g)
				if len(ev) < 2 || !ev[0] || ev[len(ev)-1] {
					t.Fatalf("group %d leader notifications %v, want true ... false", g, ev)
				}
			}
			if err := h.WaitReady(context.Background()); !errors.Is(err, ErrShutdown) {
				t.Fatalf("WaitReady after shutdown: %v", err)
			}

			// Restart on the same directory with fresh FSMs.
			fs2 := newFSMs(G)
			h2 := mustNew(t, cfg, fs2)
			waitReady(t, h2, 30*time.Second)
			for g := 0; g < G; g++ {
				if got := fs2[g].distinct(); !slices.Equal(got, want[g]) {
					t.Fatalf("group %d after restart: %v, want %v", g, got, want[g])
				}
				wantRestores := 0
				if snapshot {
					wantRestores = 1
				}
				if got := fs2[g].restoreCount(); got != wantRestores {
					t.Fatalf("group %d: %d restores, want %d", g, got, wantRestores)
				}
				if snapshot {
					first, err := h2.group(g).logs.FirstIndex()
					if err != nil {
						t.Fatal(err)
					}
					if first <= 2 {
						t.Fatalf("group %d: log starts at %d; expected the snapshotted prefix compacted", g, first)
					}
				}
			}
			// And the groups keep working.
			for g := 0; g < G; g++ {
				apply(h2, g, 42)
			}
			if err := h2.Shutdown(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBootstrapIdempotent(t *testing.T) {
	cfg := Config{
		NodeID:   "solo",
		DataDir:  t.TempDir(),
		BindAddr: "127.0.0.1:0",
		Groups:   2,
		NoSync:   true,
		Logger:   testLogger(t, slog.LevelWarn),
	}
	fs := newFSMs(2)
	h := mustNew(t, cfg, fs)
	// Not bootstrapped: no leader, WaitReady waits.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := h.WaitReady(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady on unbootstrapped host: %v", err)
	}
	servers := []raft.Server{{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}}
	if err := h.BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	if err := h.BootstrapCluster(servers); err != nil {
		t.Fatalf("second bootstrap: %v", err)
	}
	if err := h.BootstrapCluster(nil); err == nil {
		t.Fatal("bootstrap with no servers succeeded")
	}
	waitReady(t, h, 30*time.Second)
	applyRetry(t, []*Host{h}, 1, cmd(7), 5*time.Second)

	// A second Host on the same DataDir cannot open the stores.
	defer func(d time.Duration) { boltOpenTimeout = d }(boltOpenTimeout)
	boltOpenTimeout = 100 * time.Millisecond
	cfg2 := cfg
	if _, err := New(cfg2, fsmFor(newFSMs(2))); err == nil {
		t.Fatal("second host on the same data dir started")
	}
}

// TestThreeNodeCluster: three hosts in one process, one port each, G=4
// groups multiplexed on each port. The cluster is bootstrapped on one node;
// every group elects a leader and replicates to all three FSMs; when the
// leader host of group 0 is shut down, the two others elect a new leader
// and applies keep working in every group.
func TestThreeNodeCluster(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		name := "plain"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			const G, N = 4, 3
			var serverTLS, clientTLS = testCerts(t)
			fsms := make([][]*sumFSM, N)
			hosts := make([]*Host, N)
			for i := range hosts {
				cfg := Config{
					NodeID:   "node-" + string(rune('a'+i)),
					DataDir:  t.TempDir(),
					BindAddr: "127.0.0.1:0",
					Groups:   G,
					NoSync:   true,
					Logger:   testLogger(t, slog.LevelWarn).With("node", i),
				}
				if useTLS {
					cfg.ServerTLS, cfg.ClientTLS = serverTLS, clientTLS
				}
				fsms[i] = newFSMs(G)
				hosts[i] = mustNew(t, cfg, fsms[i])
			}
			servers := make([]raft.Server, N)
			for i, h := range hosts {
				servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
			}
			if err := hosts[1].BootstrapCluster(servers); err != nil {
				t.Fatal(err)
			}
			for _, h := range hosts {
				waitReady(t, h, 45*time.Second)
			}

			want := make([][]uint64, G)
			for g := 0; g < G; g++ {
				for i := 0; i < 10; i++ {
					v := uint64(g)*1_000_000 + uint64(i)
					applyRetry(t, hosts, g, cmd(v), 30*time.Second)
					want[g] = append(want[g], v)
				}
			}
			converged := func(alive []int) {
				t.Helper()
				for g := 0; g < G; g++ {
					for _, i := range alive {
						eventually(t, 30*time.Second, "replication", func() bool {
							return slices.Equal(fsms[i][g].distinct(), want[g])
						})
					}
				}
			}
			converged([]int{0, 1, 2})

			// Kill the leader host of group 0.
			killed := -1
			for i, h := range hosts {
				if h.Raft(0).State() == raft.Leader {
					killed = i
				}
			}
			if killed < 0 {
				t.Fatal("group 0 has no leader")
			}
			if err := hosts[killed].Shutdown(); err != nil {
				t.Fatalf("shutdown leader: %v", err)
			}
			var alive []*Host
			var aliveIdx []int
			for i, h := range hosts {
				if i != killed {
					alive = append(alive, h)
					aliveIdx = append(aliveIdx, i)
				}
			}
			eventually(t, 45*time.Second, "new leader of group 0", func() bool {
				for _, h := range alive {
					if h.Raft(0).State() == raft.Leader {
						return true
					}
				}
				return false
			})
			for g := 0; g < G; g++ {
				for i := 10; i < 15; i++ {
					v := uint64(g)*1_000_000 + uint64(i)
					applyRetry(t, alive, g, cmd(v), 45*time.Second)
					want[g] = append(want[g], v)
				}
			}
			converged(aliveIdx)
			// The killed node saw all of the first round.
			for g := 0; g < G; g++ {
				if got := fsms[killed][g].distinct(); !slices.Equal(got, want[g][:10]) {
					t.Fatalf("killed node group %d: %v", g, got)
				}
			}
		})
	}
}

// TestRestartWithoutWrites restarts a node several times, with a snapshot in
// between and no new commands, so that the last local entries are leader
// no-ops: WaitReady must still return and the state must be exact.
func TestRestartWithoutWrites(t *testing.T) {
	cfg := Config{
		NodeID:             "n1",
		DataDir:            t.TempDir(),
		BindAddr:           "127.0.0.1:0",
		Groups:             2,
		Bootstrap:          true,
		HeartbeatTimeout:   100 * time.Millisecond,
		ElectionTimeout:    100 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond,
		TrailingLogs:       1,
		Logger:             testLogger(t, slog.LevelWarn),
	}
	want := make([][]uint64, cfg.Groups)
	for round := 0; round < 4; round++ {
		fs := newFSMs(cfg.Groups)
		h := mustNew(t, cfg, fs)
		waitReady(t, h, 30*time.Second)
		for g := range want {
			if got := fs[g].distinct(); !slices.Equal(got, want[g]) {
				t.Fatalf("round %d group %d: %v, want %v", round, g, got, want[g])
			}
			switch round {
			case 0: // some commands
				for i := 0; i < 5; i++ {
					applyRetry(t, []*Host{h}, g, cmd(uint64(i+1)), 5*time.Second)
					want[g] = append(want[g], uint64(i+1))
				}
			case 1: // snapshot, then nothing
				if err := h.Raft(g).Snapshot().Error(); err != nil {
					t.Fatal(err)
				}
			case 2: // one more command after the snapshot
				applyRetry(t, []*Host{h}, g, cmd(100), 5*time.Second)
				want[g] = append(want[g], 100)
				if err := h.Raft(g).Barrier(5 * time.Second).Error(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
}

// batchConfFSM is a BatchingFSM that also implements ConfigurationStore.
type batchConfFSM struct {
	sumFSM
	batches int
	confs   []uint64
}

func (f *batchConfFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	f.batches++
	out := make([]interface{}, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = f.Apply(l)
		}
	}
	return out
}

func (f *batchConfFSM) StoreConfiguration(index uint64, _ raft.Configuration) {
	f.confs = append(f.confs, index)
}

type confFSM struct {
	sumFSM
	confs []uint64
}

func (f *confFSM) StoreConfiguration(index uint64, _ raft.Configuration) {
	f.confs = append(f.confs, index)
}

func TestTrackingFSM(t *testing.T) {
	conf := raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{ID: "a", Address: "x:1"}}})
	logs := []*raft.Log{
		{Index: 5, Type: raft.LogCommand, Data: cmd(1)},
		{Index: 6, Type: raft.LogConfiguration, Data: conf},
		{Index: 7, Type: raft.LogCommand, Data: cmd(2)},
	}

	plain := &sumFSM{}
	tp := newTrackingFSM(plain)
	resp := tp.ApplyBatch(logs)
	if len(resp) != 3 || resp[0] != uint64(1) || resp[1] != nil || resp[2] != uint64(3) {
		t.Fatalf("plain responses %v", resp)
	}
	if tp.seen.Load() != 7 || !slices.Equal(plain.values(), []uint64{1, 2}) {
		t.Fatalf("plain: seen %d values %v", tp.seen.Load(), plain.values())
	}

	cs := &confFSM{}
	tc := newTrackingFSM(cs)
	tc.ApplyBatch(logs)
	if !slices.Equal(cs.confs, []uint64{6}) || !slices.Equal(cs.values(), []uint64{1, 2}) {
		t.Fatalf("config store: confs %v values %v", cs.confs, cs.values())
	}

	b := &batchConfFSM{}
	tb := newTrackingFSM(b)
	tb.ApplyBatch(logs)
	if b.batches != 1 || len(b.confs) != 0 || !slices.Equal(b.values(), []uint64{1, 2}) {
		t.Fatalf("batching: batches %d confs %v values %v", b.batches, b.confs, b.values())
	}
	if r := tb.Apply(&raft.Log{Index: 9, Type: raft.LogCommand, Data: cmd(4)}); r != uint64(7) || tb.seen.Load() != 9 {
		t.Fatalf("Apply: %v seen %d", r, tb.seen.Load())
	}
}

// TestSnapshotForRestart: groups with at least minEntries applied past their
// snapshot are snapshotted (the next start restores them instead of
// re-applying the log), the others are left alone, and the restarted FSMs
// hold exactly what was applied.
func TestSnapshotForRestart(t *testing.T) {
	const G = 4
	cfg := Config{NodeID: "n1", DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: G, Bootstrap: true,
		Logger: testLogger(t, slog.LevelWarn)}
	fs := newFSMs(G)
	h := mustNew(t, cfg, fs)
	waitReady(t, h, 30*time.Second)
	want := make([][]uint64, G)
	// Groups 0 and 2 get 40 entries, 1 and 3 get 5: only the first pass
	// the 20-entry bound.
	for g := range G {
		n := 5
		if g%2 == 0 {
			n = 40
		}
		for i := range n {
			v := uint64(g*1000 + i)
			if err := h.Raft(g).Apply(cmd(v), 5*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			want[g] = append(want[g], v)
		}
	}
	snapIndex := func(h *Host, g int) string { return h.Raft(g).Stats()["last_snapshot_index"] }
	if err := h.SnapshotForRestart(context.Background(), 20); err != nil {
		t.Fatal(err)
	}
	for g := range G {
		got := snapIndex(h, g)
		if snapshotted := got != "0"; snapshotted != (g%2 == 0) {
			t.Fatalf("group %d: last_snapshot_index %s after SnapshotForRestart(20) with %d entries", g, got, len(want[g]))
		}
	}
	// With no bound, the rest are snapshotted too, and groups 0 and 2, with
	// nothing new, are no error (raft's ErrNothingNewToSnapshot).
	if err := h.SnapshotForRestart(context.Background(), 0); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	fs2 := newFSMs(G)
	h2 := mustNew(t, cfg, fs2)
	defer h2.Shutdown()
	waitReady(t, h2, 30*time.Second)
	for g := range G {
		if got := fs2[g].distinct(); !slices.Equal(got, want[g]) {
			t.Fatalf("group %d after restart: %v, want %v", g, got, want[g])
		}
		if got, wantR := fs2[g].restoreCount(), 1; got != wantR {
			t.Fatalf("group %d: %d restores after restart, want %d (snapshot taken before stopping)", g, got, wantR)
		}
	}
}
