// Package metering is the raft-replicated state of continuous-usage metering:
// spans, the deduplication ids of accepted events, the
// planned and executed intervals, the built-in ledger of usage records, dead
// letters of the HTTP sink, and per-tenant active-series samples for billing.
// It is an fsm.Module: it owns entry types 12–16 and 28 and the snapshot
// section "metering". It never reads a clock: every time it uses comes from the
// entries, which the leader stamps.
//
// # Targets and groups
//
// A target is six ids (organization, space, consumer,
// resource, plan, resource instance). Its group is chosen like a series':
// TargetHash (FNV-1a 64 over the six ids, each followed by a 0x1f separator)
// gives a hash, layout.Partition maps it to a partition, layout.GroupOf to the
// group. Every event of a target therefore goes to one raft group, which
// orders them.
//
// # Entry payloads (all integers uvarint unless said; "varint" is zigzag)
//
// Strings are uvarint length + bytes. A target is 6 strings. A measure is a
// string name and 8 bytes little-endian IEEE-754 quantity. The fields are
// fsm/wire's: uvarints and varints in their minimal form only. Builds before
// fsm/wire also accepted padded (non-minimal) varints, which no encoder ever
// wrote; a payload or section holding one is now refused.
//
//	events  (12): varint now_ms, uvarint slack_ms, count N,
//	              N × (byte kind 1=start 2=stop, string id, target,
//	                   varint timestamp_ms, start only: count M, M × measure)
//	plan    (13): varint now_ms, count N,
//	              N × (span id, version, varint start, varint end, byte backward)
//	execute (14): varint now_ms, count N,
//	              N × (span id, version, byte outcome 0=delivered 1=dead letter,
//	                   dead letter only: uvarint status code, string reason)
//	tick    (15): varint now_ms, varint ledger_cutoff_ms (records and samples
//	              with a timestamp before it are dropped; 0 keeps all)
//	series  (16): varint minute (Unix minute), count N, N × (string tenant, active)
//	targets (28, cluster version 8): empty. The switch: from this entry on,
//	              dedup records keep their target's hash. It carries no
//	              time and moves none.
//
// Bounds are checked on decode (ids and target fields ≤ MaxIDLen bytes,
// ≤ MaxMeasures measures, ≤ MaxBatch items), so a corrupt payload cannot ask
// for absurd memory; such a payload halts the group (fsm.Module).
//
// # Snapshot section "metering", version 1
//
//	byte 1 (section version), uvarint next span id
//	count, spans: id, target, measures, varint start, byte flags (1 stopped,
//	      2 planned, 4 planned backward), [varint end], varint cursor,
//	      version, seq, [varint planned start, varint planned end],
//	      string start id, string stop id
//	count, dedup: byte kind, string id, 8 bytes fingerprint LE, varint expires_ms
//	count, ledger records (see appendRecord)
//	count, dead letters: record, uvarint code, string reason, varint at_ms
//	count, series samples: string tenant, varint minute, uvarint active
//	varint last now_ms
//
// The open-target index is not stored: it is every span without an end.
//
// Version 2 (written once the switch applied or a partition's metering was
// given or received here, both of which need every replica at cluster
// version 8; version 1 otherwise, so an older build reads every section
// written while it could be a member) is version 1 with:
//
//	each span:   ... string stop id, uvarint origin span (0: started here),
//	             [uvarint origin group]
//	each dedup:  ... varint expires_ms, byte known, [8 bytes target hash LE]
//	after now:   byte hashes (the switch applied), byte moved,
//	             [uvarint partitions P, count, owned partitions rising]
//
// # Partition moves
//
// A raise moves a partition's metering with its series (move.go: which
// state moves, usage ids kept, the dedup records' hashes, the Moved fence,
// and the transfer's bytes). A group holds the partitions of its created
// range until its first move, a group a raise added none until it receives
// one; an event of a partition the group does not hold is answered Moved
// and records nothing.
//
// # Active-series samples in memory
//
// A tenant's samples of the open billing period (the UTC calendar month of
// the latest time an entry carried: any entry's now, a series entry's
// minute) are held at full resolution, 16 bytes each. When an entry moves
// that time into a later month, the samples before it are compacted, one
// block of delta varints per tenant and calendar month (series.go), a
// bounded number of samples per series or tick entry (tenants in name
// order), so the change of month costs no long pause of the apply goroutine.
// Compaction is lossless and in memory only: queries answer, and the section
// above is written, sample by sample exactly as without it, and a restore
// compacts what the section holds. Neither the entries nor the section
// changed: builds that hold every sample at full resolution read and write
// the same bytes and answer the same, so mixed builds cannot diverge and no
// cluster version gates it.
package metering
