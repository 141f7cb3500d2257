// Package ratelease is the lease-client core of Tollgate's global rate
// limits: Allow(key, n) decides locally with no network call; consumed and
// offered tokens are reported asynchronously (every ReportEvery, batched per
// owner node) to the leader of the key's rate group (api.RateGroup), which
// streams back a blocklist, a lease or the active-client count depending on the
// Strategy. Limiter is the transport-free core; Client adds the gRPC streams.
//
// It sits below both sides that decide locally: clientlib/ratelimit (what
// distributors embed) re-exports it unchanged, and the server's Envoy rate
// limit service runs one Client per node. It depends only on package api,
// gRPC, protobuf and Prometheus.
package ratelease
