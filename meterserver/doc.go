// Package meterserver serves continuous-usage metering (SPEC §6) on a node:
// the REST and gRPC event API (routed to the leader of the target's group,
// batched into raft entries), the sampler that each group leader runs (plan,
// then deliver and execute, through the ledger and an optional HTTP
// collector sink), ledger and billing queries, the metering status, its
// metrics, and the injectable clock with its test mode. The state itself is
// package fsm/metering; package server wires this one to raft (see
// server/metering.go).
package meterserver
