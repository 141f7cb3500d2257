package servertest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/server"
)

// Options says what cluster Start builds.
type Options struct {
	// Nodes is the number of nodes (at least 1). One node bootstraps every
	// group alone, without gossip; more nodes bootstrap together
	// (BootstrapExpect) after joining the first node's gossip address.
	Nodes int
	// Configure, when set, adjusts node i's configuration after the defaults
	// (and the join address) are filled in: limits, metering, clock offsets,
	// TLS, tokens, an HTTP address, a logger.
	Configure func(i int, cfg *server.Config)
	// ReadyTimeout bounds the wait for every node to be ready (default 60 s);
	// it only turns a hang into a failure.
	ReadyTimeout time.Duration
}

// StopTimeout bounds each node's graceful stop at the end of the test.
const StopTimeout = 30 * time.Second

// Cluster is a set of running in-process nodes. Its methods may be called
// from several goroutines.
type Cluster struct {
	t       testing.TB
	nodes   []*server.Server
	cfgs    []server.Config
	mu      sync.Mutex
	stopped []bool
}

// Config is the default configuration of node i of an n-node cluster, before
// the join address and Options.Configure: node ID n<i+1>, zone zone-<a+i>, a
// data directory of its own under t.TempDir(), gRPC, raft and gossip on
// loopback port 0, HTTP disabled, a 200 ms gossip probe interval, no fsync in
// raft, logs discarded. A single node bootstraps alone, without gossip, with
// short raft timers (it elects itself one heartbeat timeout after start;
// short timers cost nothing without peers).
func Config(t testing.TB, i, n int) server.Config {
	cfg := server.Config{
		Node: server.NodeConfig{
			ID:       fmt.Sprintf("n%d", i+1),
			Zone:     fmt.Sprintf("zone-%c", 'a'+i),
			DataDir:  t.TempDir(),
			GRPCAddr: "127.0.0.1:0",
			HTTPAddr: "-",
		},
		Raft:    server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Gossip:  server.GossipConfig{Addr: "127.0.0.1:0", ProbeInterval: 200 * time.Millisecond},
		Cluster: server.ClusterConfig{BootstrapExpect: n},
		Logger:  slog.New(slog.DiscardHandler),
	}
	if n > 1 {
		// A multi-node cluster with credentials needs a gossip key (or TLS)
		// to start; every node of a test cluster shares this one, so tests
		// that add an admin token keep working.
		cfg.Access.TLS.GossipKeys = [][]byte{bytes.Repeat([]byte{0x5a}, 32)}
	}
	if n == 1 {
		cfg.Cluster.BootstrapExpect, cfg.Cluster.Bootstrap, cfg.Gossip.Addr = 0, true, ""
		cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
		cfg.Raft.LeaderLeaseTimeout = 50 * time.Millisecond
	}
	return cfg
}

// Start starts an opts.Nodes-node cluster and waits until every node is
// ready. A t.Cleanup stops the nodes still running when the test ends. With
// -short a cluster of more than one node skips the test.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	n := opts.Nodes
	if n < 1 {
		t.Fatalf("servertest: %d nodes", n)
	}
	if n > 1 && testing.Short() {
		t.Skipf("cluster test (%d nodes): runs in make test, skipped with -short", n)
	}
	c := &Cluster{t: t}
	registered := false
	defer func() {
		if !registered { // a failure while starting (t.Fatal included)
			c.stopAll()
		}
	}()
	var seed string
	for i := range n {
		cfg := Config(t, i, n)
		if seed != "" {
			cfg.Gossip.Join = []string{seed}
		}
		if opts.Configure != nil {
			opts.Configure(i, &cfg)
		}
		s, err := server.New(cfg)
		if err != nil {
			t.Fatalf("servertest: node %d: %v", i, err)
		}
		if seed == "" {
			seed = s.GossipAddr()
		}
		c.mu.Lock()
		c.nodes = append(c.nodes, s)
		c.cfgs = append(c.cfgs, cfg)
		c.stopped = append(c.stopped, false)
		c.mu.Unlock()
	}
	// Registered after the data directories (t.TempDir in Config and
	// Configure): cleanups run last-in first-out, so the nodes stop before
	// their directories are removed. Until then the deferred stop above
	// covers a failure.
	t.Cleanup(c.stopAll)
	registered = true
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("servertest: %v", err)
	}
	return c
}

// WaitReady waits until every running node is ready at once (server.Server
// Ready: every group has a known leader, and each group led by a node has
// passed its leader barrier there), checking every 10 ms. Nodes ready one
// after the other are not enough: a node ready first can lose that again
// while the others get there (an early leadership change).
func (c *Cluster) WaitReady(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		why := ""
		for i, s := range c.Nodes() {
			if c.Stopped(i) {
				continue
			}
			if r := s.NotReadyReason(); r != "" {
				why = s.NodeID() + ": " + r
				break
			}
		}
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready: %s: %w", why, ctx.Err())
		case <-tick.C:
		}
	}
}

// stopAll stops every node not stopped yet, one after the other: a node
// stopping hands its leaderships off to running peers (up to 3 s, see
// server.Server.Stop), so stopping all at once would make each wait for
// peers that are stopping too.
func (c *Cluster) stopAll() {
	for i := range c.Nodes() {
		ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
		if err := c.Stop(ctx, i); err != nil {
			c.t.Logf("servertest: stop %s: %v", c.Node(i).NodeID(), err)
		}
		cancel()
	}
}

// Nodes is every node, stopped ones included, in start order.
func (c *Cluster) Nodes() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*server.Server(nil), c.nodes...)
}

// Node is node i (node ID n<i+1> unless Configure changed it).
func (c *Cluster) Node(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Index is the index of the node with this node ID, or -1.
func (c *Cluster) Index(nodeID string) int {
	for i, s := range c.Nodes() {
		if s.NodeID() == nodeID {
			return i
		}
	}
	return -1
}

// GRPCAddrs is every node's gRPC address, in start order.
func (c *Cluster) GRPCAddrs() []string {
	var out []string
	for _, s := range c.Nodes() {
		out = append(out, s.GRPCAddr())
	}
	return out
}

// Stop stops node i gracefully (server.Server.Stop, bounded by ctx; an
// expired ctx skips the leadership hand-off). The node counts as stopped from
// the call on: Leader skips it and the cleanup does not stop it again. A
// second Stop of the same node returns nil.
func (c *Cluster) Stop(ctx context.Context, i int) error {
	c.mu.Lock()
	if c.stopped[i] {
		c.mu.Unlock()
		return nil
	}
	c.stopped[i] = true
	s := c.nodes[i]
	c.mu.Unlock()
	return s.Stop(ctx)
}

// Restart starts node i again, after Stop, over its data directory with
// the configuration it was first started with (its ports chosen anew), and
// returns it; the caller waits for readiness (WaitReady).
func (c *Cluster) Restart(i int) (*server.Server, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped[i] {
		return nil, fmt.Errorf("servertest: node %d is running", i)
	}
	s, err := server.New(c.cfgs[i])
	if err != nil {
		return nil, err
	}
	c.nodes[i], c.stopped[i] = s, false
	return s, nil
}

// Stopped reports whether Stop was called for node i.
func (c *Cluster) Stopped(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped[i]
}

// Leader is the running node whose raft replica of group g is leader right
// now, or nil (during an election, or when g has no replica on a running
// node).
func (c *Cluster) Leader(g int) *server.Server {
	i := c.LeaderIndex(g)
	if i < 0 {
		return nil
	}
	return c.Node(i)
}

// LeaderIndex is Leader's index, or -1.
func (c *Cluster) LeaderIndex(g int) int {
	for i, s := range c.Nodes() {
		if c.Stopped(i) {
			continue
		}
		if r := s.Raft(g); r != nil && r.State() == raft.Leader {
			return i
		}
	}
	return -1
}
