package servertest_test

import (
	"context"
	"testing"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// TestSingleNode: one node bootstraps alone and leads every group.
func TestSingleNode(t *testing.T) {
	var configured []int
	c := servertest.Start(t, servertest.Options{Nodes: 1, Configure: func(i int, cfg *server.Config) {
		configured = append(configured, i)
		if cfg.Node.ID != "n1" || cfg.Node.Zone != "zone-a" || !cfg.Cluster.Bootstrap || cfg.Gossip.Addr != "" || cfg.Gossip.Join != nil {
			t.Errorf("default config of a single node: %+v", cfg)
		}
	}})
	if len(configured) != 1 || len(c.Nodes()) != 1 || len(c.GRPCAddrs()) != 1 || c.Index("n1") != 0 || c.Index("n2") != -1 {
		t.Fatalf("configured %v, nodes %d, addrs %v", configured, len(c.Nodes()), c.GRPCAddrs())
	}
	for g := range api.DefaultGroups {
		if c.Leader(g) != c.Node(0) {
			t.Errorf("group %d: leader %v, want n1", g, c.Leader(g))
		}
	}
	if err := c.Stop(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if !c.Stopped(0) || c.Leader(0) != nil || c.Stop(context.Background(), 0) != nil {
		t.Fatal("a stopped node still counts")
	}
}

// TestClusterConfig: three nodes join the first; under -short Start skips
// the test.
func TestClusterConfig(t *testing.T) {
	c := servertest.Start(t, servertest.Options{Nodes: 3, Configure: func(i int, cfg *server.Config) {
		if cfg.Cluster.BootstrapExpect != 3 || (i == 0) != (cfg.Gossip.Join == nil) {
			t.Errorf("node %d: %+v", i, cfg)
		}
	}})
	for g := range api.DefaultGroups {
		if c.Leader(g) == nil {
			t.Errorf("group %d: no leader once every node is ready", g)
		}
	}
}
