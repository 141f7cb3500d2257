// Package netpart holds network-partition tests on a docker-compose cluster:
// three tollgate containers in three zones, built FROM scratch from the static
// binary, with real addresses, where faults are real network cuts (`docker
// network disconnect` / `connect`), not killed processes.
//
// Each node sits on two networks this package creates per test (on /24s of
// 172.29.0.0/16 that docker accepts, so runs never clash with the demo or
// with each other): an internal "peers" network carrying raft, gossip and the
// advertised gRPC addresses, and a "clients" network through which the host
// reaches every node on ports published on 127.0.0.1 (ephemeral host ports).
// Cutting a node's peers link leaves it reachable by the checker, which is how
// the tests see that a leader cut off from its quorum acknowledges no new series.
// Cutting both links takes a whole zone away.
//
// Scenarios, all under load from the independent checker (faulttest/checker:
// no acknowledged active series rejected, no tenant over its limit (the
// nodes run the default movable shares, so it is checked per tenant), a
// cut-off node acknowledges no new series, every group writable again after each
// fault, a final sweep re-sending every acknowledged series), with every
// attempt recorded and the history checked for linearizability
// (faulttest/history; the file goes to $TOLLGATE_NETPART_LOGDIR, or to a
// temporary directory kept only when the test fails):
//
//	TestIsolateLeader      a group leader loses both peers; clients move on
//	TestPartitionFollower  a node leading nothing loses its peers
//	TestZonePartition      a zone loses both networks for 8 s, then heals
//	TestFlapLink           a node's peer link goes down and up eight times
//
// Recovery times are logged, not asserted (the machine is shared).
// TestIsolateLeader also measures "leader isolated → next acknowledged
// write"; TOLLGATE_PARTITIONS=12 gives the figure in BENCHMARKS.md.
//
// The tests skip, saying why, only where `docker info` fails or
// docker-compose is missing. The image is built once per package run; every
// container, network, volume and the image are removed at the end, on
// failure, on SIGINT/SIGTERM, and shortly before -timeout would kill the run.
// The package is test-only: this file is its only non-test source.
package netpart
