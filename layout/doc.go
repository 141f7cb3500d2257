// Package layout is the pure arithmetic of Tollgate's key space: which partition
// a series hash falls into, which raft group owns a partition, and which layouts
// (partitions P, groups G, shards S) are valid, and the partition → group
// table (Table) that replaces the arithmetic once partitions move between
// groups (docs/online-groups.md); its epoch-0 value is the arithmetic. Server, FSM, backup and clients
// must compute these identically; the package imports nothing beyond the
// standard library, so the FSM and the backup format link no gRPC.
package layout
