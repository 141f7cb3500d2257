package raftnode

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/tollgate-io/tollgate/raftnode/wal"
)

// oldLayout writes group 0 of dataDir as a node of the previous version left
// it: the raft log (a bootstrap configuration and commands 1..n, none
// applied yet) in raft.db.
func oldLayout(t *testing.T, dataDir string, n int) {
	t.Helper()
	dir := groupDir(dataDir, 0)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	snaps, err := raft.NewFileSnapshotStore(dir, 1, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("")
	rc := raft.DefaultConfig()
	rc.LocalID = "n1"
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: "127.0.0.1:1"}}}
	if err := raft.BootstrapCluster(rc, bolt, bolt, snaps, trans, conf); err != nil {
		t.Fatal(err)
	}
	var ls []*raft.Log
	for i := 1; i <= n; i++ {
		ls = append(ls, &raft.Log{Index: uint64(1 + i), Term: 1, Type: raft.LogCommand, Data: cmd(uint64(i))})
	}
	if err := bolt.StoreLogs(ls); err != nil {
		t.Fatal(err)
	}
}

func boltLogBounds(t *testing.T, dataDir string) (uint64, uint64) {
	t.Helper()
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(groupDir(dataDir, 0), "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	f, _ := bolt.FirstIndex()
	l, _ := bolt.LastIndex()
	return f, l
}

// A data dir whose log is in raft.db (the previous version) starts with its
// log moved into the shared log, nothing lost, also when an earlier move was
// interrupted after copying part of it.
func TestUpgradeMovesTheLogOutOfRaftDB(t *testing.T) {
	for _, interrupted := range []bool{false, true} {
		dataDir := t.TempDir()
		const n = 3000 // more than one copy chunk
		oldLayout(t, dataDir, n)
		if interrupted {
			// A crash after copying entries 1..700 and before deleting
			// them from raft.db.
			w, err := wal.Open(walDir(dataDir), wal.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var ls []*raft.Log
			for i := uint64(1); i <= 700; i++ {
				ls = append(ls, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: cmd(999)})
			}
			if err := w.Group(0).StoreLogs(ls); err != nil {
				t.Fatal(err)
			}
			w.Close()
		}
		og, err := InspectGroup(dataDir, 0)
		if err != nil || og.LastIndex != n+1 || len(og.Configuration.Servers) != 1 {
			t.Fatalf("inspect before the move: %+v, %v", og, err)
		}

		fs := newFSMs(1)
		h := mustNew(t, Config{NodeID: "n1", DataDir: dataDir, BindAddr: "127.0.0.1:0", Groups: 1, Logger: testLogger(t, slog.LevelWarn)}, fs)
		waitReady(t, h, 30*time.Second)
		applyRetry(t, []*Host{h}, 0, cmd(uint64(n+1)), 10*time.Second)
		want := make([]uint64, 0, n+1)
		for i := 1; i <= n+1; i++ {
			want = append(want, uint64(i))
		}
		if got := fs[0].values(); !slices.Equal(got, want) {
			t.Fatalf("interrupted=%v: applied %d commands (first %v), want 1..%d in order", interrupted, len(got), got[:min(3, len(got))], n+1)
		}
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
		if f, l := boltLogBounds(t, dataDir); f != 0 || l != 0 {
			t.Fatalf("raft.db still holds log %d..%d after the move", f, l)
		}
		og, err = InspectGroup(dataDir, 0)
		if err != nil || og.LastIndex < n+2 || og.FirstIndex != 1 {
			t.Fatalf("inspect after the move: %+v, %v", og, err)
		}
		// And it restarts from the shared log alone.
		fs = newFSMs(1)
		h = mustNew(t, Config{NodeID: "n1", DataDir: dataDir, BindAddr: "127.0.0.1:0", Groups: 1, Logger: testLogger(t, slog.LevelWarn)}, fs)
		waitReady(t, h, 30*time.Second)
		applyRetry(t, []*Host{h}, 0, cmd(uint64(n+2)), 10*time.Second)
		if got := fs[0].values(); len(got) != n+2 || got[n+1] != uint64(n+2) {
			t.Fatalf("after restart: %d commands applied, want %d", len(got), n+2)
		}
		_ = h.Shutdown()
	}
}

// The node's shared log is locked: a second node on the same data dir is
// refused with a message that says why.
func TestSharedLogIsLocked(t *testing.T) {
	dataDir := t.TempDir()
	h := mustNew(t, Config{NodeID: "n1", DataDir: dataDir, BindAddr: "127.0.0.1:0", Groups: 1, Bootstrap: true, Logger: testLogger(t, slog.LevelError)}, newFSMs(1))
	waitReady(t, h, 30*time.Second)
	_, err := New(Config{NodeID: "n1", DataDir: dataDir, BindAddr: "127.0.0.1:0", Groups: 1, Logger: testLogger(t, slog.LevelError)}, fsmFor(newFSMs(1)))
	if err == nil {
		t.Fatal("a second node opened a data dir in use")
	}
	if !strings.Contains(err.Error(), "locked") {
		t.Fatalf("error does not say the log is locked: %v", err)
	}
}
