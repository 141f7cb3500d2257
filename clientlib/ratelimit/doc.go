// Package ratelimit is the client side of Tollgate's global ingestion-rate
// limits: Allow(tenant, n) decides locally with no network call; consumed and
// offered tokens are reported asynchronously (every ReportEvery, batched per
// owner node) to the leader of the tenant's rate group (api.RateGroup), which
// streams back a blocklist, a lease or the active-client count depending on the
// Strategy. Limiter is the transport-free core; Client adds the gRPC streams.
//
// The implementation lives in package ratelease, which the server's Envoy rate
// limit service shares; this package re-exports it under its established
// names. It depends only on package api, gRPC, protobuf and Prometheus.
package ratelimit
