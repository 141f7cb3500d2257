package raftnode

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A leader that removes itself steps down and keeps its replica running
// (raft's ShutdownOnRemove would shut it down for good, leaving a dead voter
// once it is added back); added back, it receives the log again. Probe
// reaches a live group transport and fails on a closed port.
func TestRemovedLeaderKeepsRunning(t *testing.T) {
	const G, N = 1, 3
	hosts := make([]*Host, N)
	fsms := make([][]*sumFSM, N)
	for i := range hosts {
		fsms[i] = newFSMs(G)
		hosts[i] = mustNew(t, Config{NodeID: "node-" + string(rune('a'+i)), DataDir: t.TempDir(), BindAddr: "127.0.0.1:0",
			Groups: G, NoSync: true, Logger: testLogger(t, slog.LevelWarn).With("node", i)}, fsms[i])
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
	applyRetry(t, hosts, 0, cmd(1), 30*time.Second)

	var leader *Host
	eventually(t, 30*time.Second, "a leader", func() bool {
		for _, h := range hosts {
			if h.Raft(0).State() == raft.Leader {
				leader = h
				return true
			}
		}
		return false
	})
	if err := leader.Raft(0).RemoveServer(leader.NodeID(), 0, 10*time.Second).Error(); err != nil {
		t.Fatalf("leader removes itself: %v", err)
	}
	eventually(t, 30*time.Second, "the removed leader to step down", func() bool {
		return leader.Raft(0).State() != raft.Leader
	})
	if st := leader.Raft(0).State(); st == raft.Shutdown || leader.ReplicaDown(0) {
		t.Fatalf("the removed leader's replica is %v", st)
	}

	var rest []*Host
	for _, h := range hosts {
		if h != leader {
			rest = append(rest, h)
		}
	}
	applyRetry(t, rest, 0, cmd(2), 30*time.Second)
	var nl *Host
	eventually(t, 30*time.Second, "a new leader", func() bool {
		for _, h := range rest {
			if h.Raft(0).State() == raft.Leader {
				nl = h
				return true
			}
		}
		return false
	})
	if err := nl.Probe(0, leader.Addr(), 5*time.Second); err != nil {
		t.Fatalf("probe of a running node: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	if err := nl.Probe(0, raft.ServerAddress(closed), 5*time.Second); err == nil {
		t.Fatalf("probe of a closed port %s succeeded", closed)
	}
	if err := nl.Raft(0).AddVoter(leader.NodeID(), leader.Addr(), 0, 10*time.Second).Error(); err != nil {
		t.Fatalf("add the removed node back: %v", err)
	}
	applyRetry(t, rest, 0, cmd(3), 30*time.Second)
	eventually(t, 30*time.Second, "the re-added node to apply new entries", func() bool {
		v := fsms[hostIndex(hosts, leader)][0].values()
		return len(v) == 3 && v[2] == 3
	})
}

func hostIndex(hs []*Host, h *Host) int {
	for i, x := range hs {
		if x == h {
			return i
		}
	}
	return -1
}
