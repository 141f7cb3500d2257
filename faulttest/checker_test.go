package faulttest

import (
	"fmt"
	"path/filepath"
	"strings"
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

// startChecker starts the checker on c. Every attempt of its clients is
// recorded (history.jsonl beside the nodes' logs, unless cfg.History is
// already set) and finish (or checkHistory) checks the history for
// linearizability: every fault test that runs the checker checks its
// history.
func startChecker(t *testing.T, c *cluster, cfg checkerConfig) *ckr {
	t.Helper()
	if cfg.History == nil {
		cfg = withHistory(c, cfg)
	}
	return &ckr{Checker: checker.Start(t, checkerCluster{c}, c.grpcAddrs(), cfg), c: c}
}

// historyPath names the next history file: history.jsonl, then
// history-2.jsonl… (a test may run several checkers or recorders).
func (c *cluster) historyPath() string {
	c.histories++
	if c.histories == 1 {
		return filepath.Join(c.dir, "history.jsonl")
	}
	return filepath.Join(c.dir, fmt.Sprintf("history-%d.jsonl", c.histories))
}

// withHistory makes the checker record every attempt in a history file
// beside the nodes' logs; finish checks it with porcupine's tracking model.
func withHistory(c *cluster, cfg checkerConfig) checkerConfig {
	c.t.Helper()
	h, err := history.Create(c.historyPath())
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
	ck.checkHistory()
	ck.c.checkNoCrashes()
}

// checkHistory stops the recording and checks it with the tracking model;
// a violation fails the test and writes porcupine's visualisation next to
// the history (history.html). Call it after Sweep when the test sweeps, so
// that the sweep's re-sends are checked too.
func (ck *ckr) checkHistory() {
	ck.c.t.Helper()
	h := ck.Config().History
	if h == nil {
		return
	}
	start := time.Now()
	html := strings.TrimSuffix(h.Path(), ".jsonl") + ".html"
	if err := ck.CheckHistory(html, 2*time.Minute); err != nil {
		ck.c.t.Error(err)
	}
	ck.c.t.Logf("history: %d operations checked for linearizability in %v", len(h.Ops()), time.Since(start).Round(time.Millisecond))
}

// recordHistory starts a recorder writing history.jsonl beside the nodes'
// logs (kept with them, see cleanup), for tests whose clients are not the
// checker's. Close it with checkHistory.
func (c *cluster) recordHistory() *history.Recorder {
	c.t.Helper()
	h, err := history.Create(c.historyPath())
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
	if err := history.Check(m, ops, strings.TrimSuffix(h.Path(), ".jsonl")+".html", 2*time.Minute); err != nil {
		c.t.Error(err)
	}
	c.t.Logf("history: %d operations checked for linearizability in %v", len(ops), time.Since(start).Round(time.Millisecond))
}
