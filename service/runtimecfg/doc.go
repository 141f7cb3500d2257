// Package runtimecfg serves the replicated runtime configuration: the Config
// gRPC service (get, set, apply; token-protected by the server's admin rule)
// and the reconciler that copies each new version into every raft group.
//
// Where the configuration lives: every group's FSM carries a replica
// (fsm/runtimecfg), so each group leader decides from the configuration its
// own log committed — after a failover the new leader holds exactly what its
// group agreed on. Group 0 orders changes: sets and applies are proposed there
// (with compare-and-set on the version), and the reconciler on group 0's leader
// installs each new version in the other groups (an install applies only if
// newer, so copies only move forward). See ARCHITECTURE.md (runtime config) and docs/limits.md.
//
// The package reaches raft and peers only through Backend, which the server
// implements; it knows nothing of series. FileProposer proposes a node's
// --limits-file as the runtime config (file.go); ViewCache keeps the newest
// document's wire form, and its delta, for cluster views (view.go).
package runtimecfg
