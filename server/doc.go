// Package server wires one Tollgate node: it builds a group FSM per raft group,
// hosts the groups with raftnode, runs the leader path of every group it leads
// (tracker.go: batching, decisions against committed + in-flight state, one log
// entry per batch, replies after commit), serves the gRPC API and the HTTP
// endpoints (/metrics, /healthz, /readyz, /api/v1/..., and /debug/pprof when
// enabled), reloads runtime limits, and holds the data dir's lock.
package server
