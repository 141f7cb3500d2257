// Package fsm is the replicated state machine of one Tollgate raft group: which
// series of which tenant are active, and when each was last seen.
//
// It holds, per shard (hash & (S-1)) and per tenant, a compact seriesmap.Table of
// 64-bit series hashes with a one-byte minute clock (clock.go). Log entries
// (entry.go, a versioned, checksummed binary format documented there) are applied
// deterministically: time enters only through the Unix minute the leader stamps on
// each entry, never from the wall clock, and nothing random is consulted, so every
// replica fed the same log holds the same state and writes byte-identical snapshots.
//
// Entry types live in one registry (entry.go), each with the cluster version
// that introduced it. A replica that meets an entry it cannot apply (a type
// above its supported cluster version, a damaged entry) halts the group rather
// than skip it: it applies nothing more and refuses snapshots, so raft keeps the
// log for a newer build to replay (FSM.Apply, FSM.Halted).
//
// Snapshots use copy-on-write per (shard, tenant) table: Snapshot() captures the
// table pointers in O(tables); the first write to a captured table after that clones
// it, so Persist encodes an exact image of the state at the snapshot's raft index
// while applies go on. The file format is fsm/snapfmt.
//
// Modules (module.go) carry application state beside the series — runtime
// configuration, metering spans — each in a package of its own under fsm/: a
// Module owns registry rows (its entry types, cluster-versioned like the core
// ones) and one named section of the snapshot (snapfmt version 2). The FSM
// does the framing, checksums, version gate and halting; the module decodes
// and applies its payloads. Entries, the snapshot meta and the modules'
// payloads and sections share one set of byte fields, package fsm/wire.
//
// The package implements hashicorp/raft's FSM interface and knows nothing of the
// raft transport, gRPC or limits: the leader (package server) decides what is
// accepted; the FSM records it.
package fsm
