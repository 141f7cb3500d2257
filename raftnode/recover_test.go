package raftnode

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// refusingFSM is a sumFSM whose Snapshot fails, as a Tollgate FSM's does
// while it is halted on an entry it cannot apply.
type refusingFSM struct{ *sumFSM }

func (refusingFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("halted") }

// TestRecoverGroup: a three-node cluster (real raft, bolt on disk) writes to
// two groups, group 0 with a snapshot in the middle; every node stops; the
// data dir of one of them is inspected offline and recovered to that node
// alone. A state machine that refuses to snapshot leaves the group as it was;
// the real one keeps every value (snapshot and log after it), and the node
// started again alone leads both groups and commits new entries.
func TestRecoverGroup(t *testing.T) {
	const G, N = 2, 3
	fsms := make([][]*sumFSM, N)
	hosts := make([]*Host, N)
	cfgs := make([]Config, N)
	for i := range hosts {
		cfgs[i] = Config{NodeID: "node-" + string(rune('a'+i)), DataDir: t.TempDir(), BindAddr: "127.0.0.1:0", Groups: G, NoSync: true,
			Logger: testLogger(t, slog.LevelWarn).With("node", i)}
		fsms[i] = newFSMs(G)
		hosts[i] = mustNew(t, cfgs[i], fsms[i])
	}
	servers := make([]raft.Server, N)
	for i, h := range hosts {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
	}
	if err := hosts[0].BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		waitReady(t, h, 45*time.Second)
	}
	want := make([][]uint64, G)
	apply := func(n int) {
		for g := range G {
			for range n {
				v := uint64(g)*1_000_000 + uint64(len(want[g]))
				applyRetry(t, hosts, g, cmd(v), 30*time.Second)
				want[g] = append(want[g], v)
			}
		}
	}
	apply(10)
	survivor := hosts[2]
	eventually(t, 30*time.Second, "replication to the survivor", func() bool {
		return slices.Equal(fsms[2][0].distinct(), want[0])
	})
	if err := survivor.Raft(0).Snapshot().Error(); err != nil {
		t.Fatalf("snapshot of group 0: %v", err)
	}
	apply(5)
	eventually(t, 30*time.Second, "replication to the survivor", func() bool {
		return slices.Equal(fsms[2][0].values(), want[0]) && slices.Equal(fsms[2][1].values(), want[1])
	})
	addr := survivor.Addr()
	for _, h := range hosts {
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}

	dir := cfgs[2].DataDir
	before := make([]OfflineGroup, G)
	for g := range G {
		og, err := InspectGroup(dir, g)
		if err != nil {
			t.Fatal(err)
		}
		if !og.HasState || len(og.Configuration.Servers) != N || og.LastIndex == 0 || og.CurrentTerm == 0 {
			t.Fatalf("group %d offline: %+v, want state, %d servers, a log and a term", g, og, N)
		}
		if (g == 0) != (og.SnapshotIndex > 0) {
			t.Fatalf("group %d: snapshot index %d (only group 0 has a snapshot)", g, og.SnapshotIndex)
		}
		before[g] = og
	}
	alone := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "node-c", Address: addr}}}

	// A state machine that cannot snapshot: refused, nothing changed.
	if err := RecoverGroup(dir, 0, "node-c", refusingFSM{&sumFSM{}}, alone, nil); err == nil {
		t.Fatal("recovery with a state machine that cannot snapshot succeeded")
	}
	if og, err := InspectGroup(dir, 0); err != nil || !sameOffline(og, before[0]) {
		t.Fatalf("after a refused recovery group 0 is %+v (err %v), want it unchanged: %+v", og, err, before[0])
	}
	if err := RecoverGroup(dir, 0, "", &sumFSM{}, alone, nil); err == nil {
		t.Fatal("recovery without a node id succeeded")
	}

	for g := range G {
		if err := RecoverGroup(dir, g, "node-c", &sumFSM{}, alone, nil); err != nil {
			t.Fatalf("recover group %d: %v", g, err)
		}
		og, err := InspectGroup(dir, g)
		if err != nil {
			t.Fatal(err)
		}
		if len(og.Configuration.Servers) != 1 || og.Configuration.Servers[0].ID != "node-c" || og.LastIndex != before[g].LastIndex {
			t.Fatalf("group %d after recovery: %+v, want node-c alone at last index %d", g, og, before[g].LastIndex)
		}
	}

	cfg := cfgs[2]
	cfg.BindAddr = string(addr)
	fs := newFSMs(G)
	h := mustNew(t, cfg, fs)
	waitReady(t, h, 45*time.Second)
	for g := range G {
		eventually(t, 30*time.Second, "leadership", func() bool { return h.Raft(g).State() == raft.Leader })
		if got := fs[g].values(); !slices.Equal(got, want[g]) {
			t.Fatalf("group %d after recovery holds %v, want %v", g, got, want[g])
		}
		if err := h.Raft(g).Apply(cmd(42), 10*time.Second).Error(); err != nil {
			t.Fatalf("group %d: apply on the recovered node: %v", g, err)
		}
	}
}

func sameOffline(a, b OfflineGroup) bool {
	return a.HasState == b.HasState && a.FirstIndex == b.FirstIndex && a.LastIndex == b.LastIndex && a.LastTerm == b.LastTerm &&
		a.SnapshotIndex == b.SnapshotIndex && a.ConfigurationIndex == b.ConfigurationIndex && slices.Equal(a.Configuration.Servers, b.Configuration.Servers)
}
