// Package server wires one Tollgate node: it builds a group FSM per raft group,
// hosts the groups with raftnode, runs the leader path of every group it leads
// (package admission, wired in tracker.go; errors.go maps its and raft's errors
// to gRPC codes), serves the gRPC API and the HTTP endpoints (/metrics,
// /healthz, /readyz, /api/v1/..., /ui/, and /debug/pprof when enabled), reloads
// runtime limits, and holds the data dir's lock. Cluster control (placement,
// learners, moves, incarnations) is package cluster's controller, which
// reaches this node through the port in clusterport.go; server keeps the
// cluster view it serves (cluster.go) and the admin handlers that call it.
// Access control (credentials, rules, bounds) is package access.
//
// The capabilities are one list, components.go: each entry builds its
// capability (its FSM modules included) from the node's port (nodePort, a
// nodeport.Port), and New, gRPC and HTTP registration, start and Stop walk
// that list in order. The capabilities themselves live in service/<name>
// (movable shares' Node, the sampling Owner, the Envoy rate limit service,
// the sketch hub, the limits-file proposer, ...); what this package keeps of
// each is its entry and a short wiring file: the node's state it reads
// (limits, usage, clocks) and the admin guards of its endpoints.
package server
