// Package integration holds the tests that span packages on a real
// in-process cluster (server/servertest: real raft on disk, real gRPC and
// HTTP on loopback): metering end to end (events, sinks, billing, samples,
// compaction, hostile input), the global rate limit's owner across
// failover and skewed clocks, and the REST contract (api/openapi.yaml)
// against a running node. A package's own tests stay beside it and do
// not start servers; process-level fault tests are in faulttest.
//
// It has no code of its own: `go test ./integration` runs it, and `make
// test-fast` (-short) skips its clusters of more than one node.
package integration
