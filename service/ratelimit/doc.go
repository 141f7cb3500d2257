// Package ratelimit is the owner side of global ingestion-rate limits:
// the in-memory rate state of the tenants whose raft group this node leads,
// absorbing clients' asynchronous reports and computing what each client needs
// to decide locally (a blocklist, a lease, or the limit and active-client
// count), plus the gRPC RateLimit service that carries both. The core (Owner,
// Session) does no I/O and takes time as an argument, so strategies are tested
// on a simulated clock; Service adds the streams and the tick loop.
//
// The files, one concern each:
//
//   - owner.go: Config, the Owner and its shards, a tenant's state.
//   - session.go: a client's stream (Session): Absorb, the (stream, tenant)
//     entries, Take.
//   - round.go: the tick (Owner.Tick): fold the reports, decide per shard,
//     build every stream's update.
//   - lease.go: the decisions: the blocklist rule, a Lease client's grant,
//     the bucket's window and one-second cap.
//   - recycle.go: what is given back and reused: a reconnecting client's
//     tick state (carryOver), forgotten tenants, sent updates (Recycle).
//   - skew.go: a new owner's window rebuilt from clients' bucket counts by
//     age, so no wall clock is compared (docs/clocks.md).
//   - sliding.go: sliding-window tenants (Envoy rules) and Admit.
//   - handoff.go: a raise's moved sliding key handed over by its previous
//     owner (Release there, Import here), held meanwhile.
//   - metrics.go: the counts and the Prometheus collector.
//   - service.go: the gRPC streams and the tick loop.
//
// # Lock order
//
// Outermost first; a path takes a subset, in this order, never the reverse:
//
//  1. Owner.tickMu: one Tick at a time (held for the whole tick).
//  2. shard.mu, ascending shard index (lockShards; a tick's shard worker
//     holds its own shard's only).
//  3. Owner.mu: the sessions, the clients' records, lastTick.
//  4. Session.mu: one stream's entries and pending update.
//  5. A second Session.mu, only with Owner.mu held (carryOver,
//     askerRelease): Owner.mu serialises every path that holds two.
//
// Service.budgetMu is a leaf: nothing is locked while it is held. Fields
// say which lock guards them; tick-owned fields of a tenant are written
// only by the tick of its shard, with that shard's lock held.
package ratelimit
