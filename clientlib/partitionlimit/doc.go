// Package partitionlimit caps the distinct series a tenant sends to one ingest
// partition over a sliding window, deciding locally on the
// hot path with no network round trip.
//
// Per (tenant, partition) the Limiter keeps one HyperLogLog sketch per minute
// for the last Window minutes, and the register-wise maximum of those sketches
// (the window sketch) with a histogram of its register values, so an estimate
// costs O(64) whatever the precision. Check adds a request's hashes to the
// window sketch tentatively, estimates every touched partition, and either
// commits the hashes to the current minute's sketch (all partitions within
// their limit) or undoes them and returns a *LimitError (any partition over).
//
// With Config.Addrs set, a background loop pushes the registers that changed
// locally to a Tollgate node about every second (Sketches.PushSketches) and
// merges what the node streams back (Sketches.WatchSketches): the union of
// every client's sketches, so each client decides on the cluster-wide
// cardinality. When no node answers, Check keeps deciding from the local and
// last-received state (fail open on the remote part) and Stats says so.
// When its watch stream breaks or another node starts accepting its pushes,
// it resends every in-window sketch once: a node that died may have
// acknowledged pushes it had not yet passed to its peers.
//
// Limits: a *clientlib.Client satisfies Limits (it reads the newest
// replicated runtime configuration); package partitionlimitprom exports Stats
// to Prometheus.
//
// The package depends only on api, gRPC and the standard library; it does not
// need the series tracker (package clientlib).
package partitionlimit
