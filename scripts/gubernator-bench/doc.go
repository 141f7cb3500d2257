// Command gubernator-bench drives Gubernator (a peer rate limit service that
// Tollgate is measured against) through Gubernator's own gRPC client,
// GetRateLimits with the token bucket, and prints one JSON line with the same
// fields as `tollgate envoybench --json`, so scripts/peer-gubernator.sh can
// put the two side by side.
//
// It is its own Go module so that Gubernator and its dependencies never enter
// Tollgate's go.mod: it is a peer to measure, not code Tollgate uses.
package main
