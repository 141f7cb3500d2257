package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/layout"
)

const seedP, seedG, seedS = 64, 4, 16

// seedSource is one group's FSM with known series and its snapshot.
type seedSource struct {
	fsm    *fsm.FSM
	hashes map[string][]uint64 // tenant -> series it holds
	data   []byte
	header snapfmt.Header
}

func newSeedFSM(t *testing.T, g int) *fsm.FSM {
	t.Helper()
	f, err := fsm.New(fsm.Config{Partitions: seedP, Groups: seedG, Shards: seedS, Group: g})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// seedSources builds one FSM per group. Every group but the last gets a few
// track entries (several tenants, ~1500 series) at group-specific raft
// positions; the last stays empty (a snapshot at index 0, term 0).
func seedSources(t *testing.T) []seedSource {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 6))
	out := make([]seedSource, seedG)
	for g := range out {
		f := newSeedFSM(t, g)
		lo, hi := f.PartitionRange()
		src := seedSource{fsm: f, hashes: map[string][]uint64{}}
		if g < seedG-1 {
			index, term := uint64(100+7*g), uint64(3+g)
			for e := 0; e < 3; e++ {
				var ths []fsm.TenantHashes
				for tn := 0; tn < 1+g; tn++ {
					name := fmt.Sprintf("tenant-%d", tn)
					th := fsm.TenantHashes{Tenant: name}
					for i := 0; i < 500/(1+g); i++ {
						first, last := layout.PartitionHashRange(lo+r.IntN(hi-lo), seedP)
						h := first + r.Uint64N(last-first)
						th.Hashes = append(th.Hashes, h)
						src.hashes[name] = append(src.hashes[name], h)
					}
					ths = append(ths, th)
				}
				l := &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: fsm.AppendTrack(nil, 29_000_000, ths)}
				if res := f.Apply(l); res != nil {
					t.Fatalf("group %d: apply: %v", g, res)
				}
				index++
			}
		}
		var buf bytes.Buffer
		if err := f.WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		src.data = buf.Bytes()
		sum, err := snapfmt.Inspect(bytes.NewReader(src.data))
		if err != nil {
			t.Fatal(err)
		}
		src.header = sum.Header
		out[g] = src
	}
	if out[0].fsm.Stats().Series < 1000 || out[seedG-1].header.Index != 0 {
		t.Fatal("test data is not what the test expects")
	}
	return out
}

func seedAll(t *testing.T, dir, nodeID, addr string, srcs []seedSource) {
	t.Helper()
	for g, s := range srcs {
		if err := SeedGroup(dir, g, nodeID, addr, s.header.Index, s.header.Term, bytes.NewReader(s.data), int64(len(s.data))); err != nil {
			t.Fatal(err)
		}
	}
}

// checkSeeded verifies that fsms hold exactly the sources' state.
func checkSeeded(t *testing.T, fsms []*fsm.FSM, srcs []seedSource) {
	t.Helper()
	for g, s := range srcs {
		f := fsms[g]
		if got, want := f.Stats(), s.fsm.Stats(); got != want {
			t.Fatalf("group %d: stats %+v, want %+v", g, got, want)
		}
		for name, hs := range s.hashes {
			out := make([]uint8, len(hs))
			f.Lookup(name, hs, 29_000_000, fsm.DefaultIdleMinutes, out)
			for i, st := range out {
				if st != fsm.StateFresh {
					t.Fatalf("group %d tenant %s: hash %d state %d, want fresh", g, name, i, st)
				}
			}
		}
		// Deterministic encoding: the same state writes the same bytes.
		var buf bytes.Buffer
		if err := f.WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), s.data) {
			t.Fatalf("group %d: re-snapshot differs from the seeded snapshot (%d vs %d bytes)", g, buf.Len(), len(s.data))
		}
	}
}

func snapshotNames(t *testing.T, dir string, g int) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(dir, fmt.Sprintf("group-%d", g), "snapshots"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// TestSeedGroup seeds every group of an empty data dir with real FSM
// snapshots, starts a Host on it (real raft, bolt on disk) and checks that
// the node leads every group in a term above the seeded one with exactly
// the seeded state; then that new entries replicate on top of it and that
// everything survives a restart.
func TestSeedGroup(t *testing.T) {
	srcs := seedSources(t)
	dir := t.TempDir()
	// A single voter never dials its own address, so the advertised address
	// need not be the bound one: seeding an address and advertising it
	// avoids racing for a free port.
	const nodeID, addr = "restored-1", "127.0.0.1:17301"

	if has, err := HasState(dir, seedG); err != nil || has {
		t.Fatalf("HasState on an empty dir: %v, %v", has, err)
	}
	seedAll(t, dir, nodeID, addr, srcs)
	if has, err := HasState(dir, seedG); err != nil || !has {
		t.Fatalf("HasState after seeding: %v, %v", has, err)
	}
	// Seeding again is refused and writes nothing.
	before := snapshotNames(t, dir, 0)
	err := SeedGroup(dir, 0, nodeID, addr, 1, 1, bytes.NewReader(srcs[0].data), int64(len(srcs[0].data)))
	if !errors.Is(err, ErrHasState) || !strings.Contains(err.Error(), "raft snapshot") {
		t.Fatalf("second seed: %v, want ErrHasState naming the snapshot", err)
	}
	if after := snapshotNames(t, dir, 0); len(after) != 1 || after[0] != before[0] {
		t.Fatalf("snapshots %v after a refused seed, want %v", after, before)
	}

	cfg := Config{
		NodeID:        nodeID,
		DataDir:       dir,
		BindAddr:      "127.0.0.1:0",
		AdvertiseAddr: addr,
		Groups:        seedG,
		Logger:        testLogger(t, slog.LevelWarn),
	}
	start := func() (*Host, []*fsm.FSM) {
		t.Helper()
		fsms := make([]*fsm.FSM, seedG)
		for g := range fsms {
			fsms[g] = newSeedFSM(t, g)
		}
		h, err := New(cfg, func(g int) raft.FSM { return fsms[g] })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Shutdown() })
		waitReady(t, h, 45*time.Second)
		for g := range fsms {
			r := h.Raft(g)
			eventually(t, 30*time.Second, fmt.Sprintf("group %d leader", g), func() bool { return r.State() == raft.Leader })
			if err := r.Barrier(5 * time.Second).Error(); err != nil {
				t.Fatalf("group %d barrier: %v", g, err)
			}
			conf := r.GetConfiguration()
			if err := conf.Error(); err != nil {
				t.Fatal(err)
			}
			if s := conf.Configuration().Servers; len(s) != 1 || s[0].ID != raft.ServerID(nodeID) || s[0].Address != addr || s[0].Suffrage != raft.Voter {
				t.Fatalf("group %d configuration %+v, want the single voter %s at %s", g, s, nodeID, addr)
			}
			term, _ := strconv.ParseUint(r.Stats()["term"], 10, 64)
			if seeded := max(srcs[g].header.Term, 1); term <= seeded {
				t.Fatalf("group %d: leader term %d, want > seeded term %d", g, term, seeded)
			}
		}
		return h, fsms
	}

	h, fsms := start()
	checkSeeded(t, fsms, srcs)

	// New series on top of the seeded state, in group 0 and in the empty group.
	extra := map[int][]uint64{}
	for _, g := range []int{0, seedG - 1} {
		lo, _ := layout.GroupRange(g, seedP, seedG)
		first, _ := layout.PartitionHashRange(lo, seedP)
		hs := []uint64{first + 1, first + 2, first + 3}
		extra[g] = hs
		f := h.Raft(g).Apply(fsm.AppendTrack(nil, 29_000_000, []fsm.TenantHashes{{Tenant: "late", Hashes: hs}}), 5*time.Second)
		if err := f.Error(); err != nil {
			t.Fatalf("group %d apply: %v", g, err)
		}
		if res := f.Response(); res != nil {
			t.Fatalf("group %d apply: %v", g, res)
		}
		if got := fsms[g].TenantActive("late"); got != 3 {
			t.Fatalf("group %d: %d late series, want 3", g, got)
		}
		// The raft log continues after the seeded index.
		if idx := fsms[g].AppliedIndex(); idx <= srcs[g].header.Index {
			t.Fatalf("group %d: applied index %d, want > seeded %d", g, idx, srcs[g].header.Index)
		}
	}
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// Restart: seeded snapshot + log replay.
	_, fsms = start()
	for g, s := range srcs {
		want := s.fsm.Stats().Series + int64(len(extra[g]))
		if got := fsms[g].Stats().Series; got != want {
			t.Fatalf("group %d after restart: %d series, want %d", g, got, want)
		}
		for name, hs := range s.hashes {
			out := make([]uint8, len(hs))
			fsms[g].Lookup(name, hs, 29_000_000, fsm.DefaultIdleMinutes, out)
			if !bytes.Equal(out, bytes.Repeat([]byte{fsm.StateFresh}, len(hs))) {
				t.Fatalf("group %d tenant %s: seeded series lost after restart", g, name)
			}
		}
	}
}

// TestSeedGroupRefuses: seeding refuses a group with raft state (from a
// bootstrapped node), bad arguments and short data, and leaves nothing
// behind; HasState tells empty, stateful and locked data dirs apart.
func TestSeedGroupRefuses(t *testing.T) {
	src := seedSources(t)[0]
	data := func() io.Reader { return bytes.NewReader(src.data) }
	size := int64(len(src.data))
	const addr = "127.0.0.1:17302"

	// Arguments, checked before anything is touched.
	empty := t.TempDir()
	for name, err := range map[string]error{
		"no dir":      SeedGroup("", 0, "n1", addr, 1, 1, data(), size),
		"group":       SeedGroup(empty, -1, "n1", addr, 1, 1, data(), size),
		"node id":     SeedGroup(empty, 0, "", addr, 1, 1, data(), size),
		"no port":     SeedGroup(empty, 0, "n1", "127.0.0.1", 1, 1, data(), size),
		"port 0":      SeedGroup(empty, 0, "n1", "127.0.0.1:0", 1, 1, data(), size),
		"unspecified": SeedGroup(empty, 0, "n1", "0.0.0.0:7301", 1, 1, data(), size),
		"nil data":    SeedGroup(empty, 0, "n1", addr, 1, 1, nil, size),
		"size":        SeedGroup(empty, 0, "n1", addr, 1, 1, data(), 0),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Short data: an error, and nothing left behind.
	err := SeedGroup(empty, 0, "n1", addr, 1, 1, bytes.NewReader(src.data[:10]), size)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short data: %v, want io.ErrUnexpectedEOF", err)
	}
	if es, _ := os.ReadDir(empty); len(es) != 0 {
		t.Fatalf("data dir not empty after failed seeds: %v", es)
	}
	if _, err := HasState(empty, 0); err == nil {
		t.Fatal("HasState with 0 groups accepted")
	}
	if has, err := HasState(filepath.Join(empty, "absent"), 4); has || err != nil {
		t.Fatalf("HasState of a missing dir: %v, %v", has, err)
	}

	// A node that started without bootstrap leaves empty stores: no state,
	// and seeding works there.
	idle := t.TempDir()
	h := mustNew(t, Config{NodeID: "n1", DataDir: idle, BindAddr: "127.0.0.1:0", Groups: 2, Logger: testLogger(t, slog.LevelError)}, newFSMs(2))
	func() { // locked while the node runs
		defer func(d time.Duration) { boltOpenTimeout = d }(boltOpenTimeout)
		boltOpenTimeout = 100 * time.Millisecond
		if _, err := HasState(idle, 2); err == nil || !strings.Contains(err.Error(), "locked") {
			t.Errorf("HasState on a running node's dir: %v, want a lock error", err)
		}
		if err := SeedGroup(idle, 0, "n1", addr, 1, 1, data(), size); err == nil {
			t.Error("seeded a running node's dir")
		}
	}()
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if has, err := HasState(idle, 2); has || err != nil {
		t.Fatalf("HasState of a never-bootstrapped node: %v, %v", has, err)
	}
	// A failure in an existing group dir leaves it as it was.
	if err := SeedGroup(idle, 1, "n1", addr, 1, 1, bytes.NewReader(nil), size); err == nil {
		t.Fatal("seeded from empty data")
	}
	if has, err := HasState(idle, 2); has || err != nil || len(snapshotNames(t, idle, 1)) != 0 {
		t.Fatalf("after a failed seed: %v, %v, snapshots %v", has, err, snapshotNames(t, idle, 1))
	}
	if err := SeedGroup(idle, 0, "n1", addr, src.header.Index, src.header.Term, data(), size); err != nil {
		t.Fatalf("seeding a never-bootstrapped node's dir: %v", err)
	}

	// A bootstrapped node has state in every group: refused, nothing written.
	boot := t.TempDir()
	fs := newFSMs(2)
	h = mustNew(t, Config{NodeID: "n1", DataDir: boot, BindAddr: "127.0.0.1:0", Groups: 2, Bootstrap: true, Logger: testLogger(t, slog.LevelError)}, fs)
	waitReady(t, h, 30*time.Second)
	applyRetry(t, []*Host{h}, 1, cmd(7), 5*time.Second)
	if err := h.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if has, err := HasState(boot, 2); !has || err != nil {
		t.Fatalf("HasState of a bootstrapped node: %v, %v", has, err)
	}
	for g := 0; g < 2; g++ {
		err := SeedGroup(boot, g, "n1", addr, 1, 1, data(), size)
		if !errors.Is(err, ErrHasState) || !strings.Contains(err.Error(), "raft log entries") {
			t.Fatalf("group %d: seeding a bootstrapped group: %v, want ErrHasState naming the log", g, err)
		}
		if s := snapshotNames(t, boot, g); len(s) != 0 {
			t.Fatalf("group %d: snapshots %v after a refused seed", g, s)
		}
	}
}
