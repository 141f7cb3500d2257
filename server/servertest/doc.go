// Package servertest starts in-process clusters of real server.Server nodes
// for tests outside package server: real raft on disk (in the test's
// temporary directories), real gRPC (and, when a test asks for it, HTTP) on
// loopback, real gossip between the nodes. Nothing is mocked.
//
// It is for tests only. Package server cannot use it from its own internal
// tests (servertest imports server), and neither can the internal tests of a
// package that server imports (service/ratelimit, service/metering, …): their external
// test packages (package foo_test) can. servertest never imports clientlib:
// the server side does not depend on the client library.
//
// Start builds each node's configuration from common defaults (node IDs n1…,
// zones zone-a…, one data directory per node, loopback addresses on port 0,
// no fsync in raft, logs discarded), lets the test adjust each node's
// configuration, joins the nodes, waits until every node is ready (every group
// has a leader) and stops the nodes when the test ends. Under -short (make
// test-fast) a cluster of more than one node is skipped: elections and
// failovers take seconds each, make test runs them.
package servertest
