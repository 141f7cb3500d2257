package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"
)

// freeGossipPort returns a loopback port free for both TCP and UDP (serf
// uses the same port for both), from the package's range below the
// ephemeral ports: a kernel-chosen port can go to an outgoing connection of
// a test running beside this one before serf binds it (it did, in CI).
func freeGossipPort(t *testing.T) int {
	t.Helper()
	p, err := serverPorts.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSeedListNamingItselfStillFormsCluster: every node of a StatefulSet has
// the same seed list, itself included. A node whose first join reaches only
// itself (the other names do not resolve yet) must keep contacting the seeds
// until bootstrap_expect members are alive; with one join and done, node a
// (seeds a, b; b not up yet) and node b (seeds: itself only, as if a's name did
// not resolve for it) would each stay alone and never bootstrap.
func TestSeedListNamingItselfStillFormsCluster(t *testing.T) {
	skipClusterIfShort(t, 2)
	pa, pb := freeGossipPort(t), freeGossipPort(t)
	addr := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	start := func(id, zone string, gossip int, join ...string) *Server {
		s, err := New(Config{
			Node:    NodeConfig{ID: id, Zone: zone, DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
			Raft:    RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
			Gossip:  GossipConfig{Addr: addr(gossip), ProbeInterval: 200 * time.Millisecond, Join: join},
			Cluster: ClusterConfig{BootstrapExpect: 2, Replicas: 2},
			Access:  AccessConfig{AdminToken: testToken, TLS: TLSConfig{GossipKeys: testGossipKeys}},
			Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = s.Stop(ctx)
		})
		return s
	}
	a := start("a", "zone-a", pa, addr(pa), addr(pb))
	// Let a's first join happen while b is down: it reaches only a itself.
	time.Sleep(time.Second)
	b := start("b", "zone-b", pb, addr(pb))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // only catches a hang
	defer cancel()
	for _, s := range []*Server{a, b} {
		if err := s.WaitReady(ctx); err != nil {
			t.Fatalf("%s never became ready (%s): the nodes did not find each other", s.NodeID(), s.NotReadyReason())
		}
	}
}
