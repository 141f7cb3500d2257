package faulttest

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/faulttest/checker"
	"github.com/tollgate-io/tollgate/faulttest/history"
)

// The checker itself lives in faulttest/checker (shared with the
// docker-compose partition tests); this file binds it to the loopback
// harness under the names the tests here use.

type checkerConfig = checker.Config

// ckr is a running checker bound to a loopback cluster.
type ckr struct {
	*checker.Checker
	c *cluster
}

func defaultClusterOptions() clusterOptions {
	return clusterOptions{defaultMaxSeries: checker.DefaultMaxSeries, tenantMaxSeries: map[string]int64{"t-mid": 40000, "t-big": 4000000}}
}

// defaultCheckerConfig checks (b) per tenant: these clusters run the server's
// default share mode, movable, which is what operators deploy.
func defaultCheckerConfig() checkerConfig {
	return checker.DefaultConfig()
}

// staticShares switches a test to --share-mode static and the checker's (b)
// to each group's fixed share, so that one real-process fault test keeps
// covering the static mode.
func staticShares(opts clusterOptions, cfg checkerConfig) (clusterOptions, checkerConfig) {
	opts.shareMode = "static"
	cfg.StaticShares = true
	return opts, cfg
}

// checkerCluster adapts *cluster to checker.Cluster.
type checkerCluster struct{ c *cluster }

func (a checkerCluster) Conn(addr string) *grpc.ClientConn { return a.c.conn(addr) }
func (a checkerCluster) Describe() string                  { return a.c.describe() }

func startChecker(t *testing.T, c *cluster, cfg checkerConfig) *ckr {
	t.Helper()
	return &ckr{Checker: checker.Start(t, checkerCluster{c}, c.grpcAddrs(), cfg), c: c}
}

// withHistory makes the checker record every attempt in history.jsonl beside
// the nodes' logs; finish checks it with porcupine's tracking model.
func withHistory(c *cluster, cfg checkerConfig) checkerConfig {
	c.t.Helper()
	h, err := history.Create(filepath.Join(c.dir, "history.jsonl"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = h.Close() }) // idempotent; finish closes it first
	cfg.History = h
	return cfg
}

func (ck *ckr) waitProgress(what string) { ck.WaitProgress(what) }

// finish stops the writers, sweeps every acknowledged hash through the
// (healthy) cluster, logs the counts and asserts 0 violations.
func (ck *ckr) finish() {
	ck.c.t.Helper()
	ck.Stop()
	ck.c.waitHealthy()
	ck.Sweep()
	ck.Report()
	if h := ck.Config().History; h != nil {
		start := time.Now()
		if err := ck.CheckHistory(filepath.Join(ck.c.dir, "history.html"), 2*time.Minute); err != nil {
			ck.c.t.Error(err)
		}
		ck.c.t.Logf("history: %d operations checked for linearizability in %v", len(h.Ops()), time.Since(start).Round(time.Millisecond))
	}
	ck.c.checkNoCrashes()
}

// recordHistory starts a recorder writing history.jsonl beside the nodes'
// logs (kept with them, see cleanup), for tests whose clients are not the
// checker's. Close it with checkHistory.
func (c *cluster) recordHistory() *history.Recorder {
	c.t.Helper()
	h, err := history.Create(filepath.Join(c.dir, "history.jsonl"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = h.Close() }) // idempotent
	return h
}

// checkHistory closes h and checks its operations, plus extra (operations
// derived from a recorded one, e.g. one ledger read per instance), with m.
// A violation fails the test and writes porcupine's visualisation to
// history.html beside the history.
func (c *cluster) checkHistory(h *history.Recorder, m history.Model, extra ...history.Op) {
	c.t.Helper()
	if err := h.Close(); err != nil {
		c.t.Fatal(err)
	}
	ops := append(h.Ops(), extra...)
	start := time.Now()
	if err := history.Check(m, ops, filepath.Join(c.dir, "history.html"), 2*time.Minute); err != nil {
		c.t.Error(err)
	}
	c.t.Logf("history: %d operations checked for linearizability in %v", len(ops), time.Since(start).Round(time.Millisecond))
}
