// Package metering serves continuous-usage metering on a node:
// the REST and gRPC event API (routed to the leader of the target's group,
// batched into raft entries), the sampler that each group leader runs (plan,
// then deliver and execute, through the ledger and an optional HTTP
// collector sink), ledger and billing queries (billing.go: a tenant's p95
// bill, and the month-to-date BillingSummary of every tenant that
// /api/v1/status shows), the metering status, its metrics, and the
// injectable clock with its test mode (POST /v1/metering/clock and the
// SetClock RPC, both under the node's admin rule, refused on a node not
// started with --metering-test-clock). The state itself is package
// fsm/metering; package server wires this one to raft (see
// server/metering.go).
package metering
