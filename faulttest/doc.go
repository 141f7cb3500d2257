// Package faulttest holds end-to-end fault tests that run real tollgate
// processes on loopback: a three-node, three-zone cluster built from
// ./cmd/tollgate, under load from an independent checker client (raw gRPC, not
// clientlib), while nodes are killed (SIGKILL), frozen (SIGSTOP/SIGCONT),
// stopped gracefully (SIGTERM), restarted, and while raft membership changes.
//
// The checker asserts the product's consistency promise: no series
// that was acknowledged is ever rejected afterwards, a tenant never holds more
// acknowledged series than the highest limit it has had (the server's default
// movable shares; TestStopCont runs --share-mode static and checks each
// group's fixed share instead), and the cluster accepts writes again after
// every fault. TestFailoverTiming measures
// the time from a leader SIGKILL to the next successful write
// (TOLLGATE_FAILOVER_KILLS=20 for the figure in BENCHMARKS.md).
//
// Every test that runs the checker also records every attempt (history.jsonl
// beside the node logs) and checks the history for linearizability with the
// tracking model of faulttest/history at the end; TestMeteringKillDuringSampling
// checks its metering events with the metering model. The tests that call
// clientlib themselves (clock, stall, exact-share) record their calls through
// trackHistory, one operation per partition a call touches.
// TestCheckerCatchesBrokenBuilds runs three deliberately broken servers
// (tollgate_broken build tag) and requires each history check to fail;
// TestTrackHistoryCatchesBrokenBuild does the same for trackHistory. docs/testing.md says what each test
// proves and what it does not.
//
// The procedures of the operations runbook (docs/operations.md) run here too,
// step by step with the tollgate CLI: replacing nodes and zones
// (TestReplaceNodesAndZone), recovering groups that lost their quorum with
// `tollgate raft recover` (TestRaftRecoverAfterLosingTwoOfThree), rotating the
// CA, certificates and gossip key (TestCertificateRotation).
//
// The clock tests (clock_test.go) start nodes whose wall clock is shifted by
// the hidden --test-clock-offset flag, monotonic time untouched, and check
// idle expiry, re-sends and metering retries across skewed leaders, the
// refusal of out-of-bound nodes and the offsets status reports.
//
// The zero-downtime tests look from a distributor's side instead: a clientlib
// client with FailOpen on must see no error and no fail-open decision while
// every node is restarted in turn and while leadership moves
// (TestPlannedMovesInvisible; TOLLGATE_LEADER_MOVES=100), and a quiet cluster
// must hold no election (TestSteadyNoElections; TOLLGATE_STEADY_DURATION=10m).
// TOLLGATE_FAULTTEST_SERVER_ARGS adds flags to every node, to measure other
// settings (e.g. raft timers) without a code change.
//
// The package is test-only: this file is its only non-test source. The tests
// run in `go test ./...` (they take a few minutes) and with `make test-fault`.
package faulttest
