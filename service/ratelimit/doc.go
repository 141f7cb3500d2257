// Package ratelimit is the owner side of global ingestion-rate limits:
// the in-memory rate state of the tenants whose raft group this node leads,
// absorbing clients' asynchronous reports and computing what each client needs
// to decide locally (a blocklist, a lease, or the limit and active-client
// count), plus the gRPC RateLimit service that carries both. The core (Owner,
// Session) does no I/O and takes time as an argument, so strategies are tested
// on a simulated clock; Service adds the streams and the tick loop.
package ratelimit
