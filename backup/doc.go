// Package backup is Tollgate's cluster backup file: one consistent snapshot
// of every raft group of a cluster in one file, for `tollgate snapshot save |
// inspect | restore`.
//
// A backup holds a Header (the cluster layout: partitions, groups, shards;
// when it was taken; a free-form source) and, for each group 0..G-1 in
// order, the group's raft index and term and its FSM snapshot in package
// fsm/snapfmt's format, verbatim. The byte format is documented field by
// field in format.md; in short:
//
//	header   magic "TGBACKUP", version, P, G, S, created, sections, source, [base B: version 2, a raised cluster], crc32c
//	section* per group: kind 'G', group, index, term, data length, data crc32c,
//	         frame crc32c, then the snapfmt snapshot
//	trailer  kind 'E', section count, crc chain, crc32c
//
// Writing: NewWriter validates and writes the header; AddGroup verifies that
// the data is a complete, valid snapshot of that group of the layout at the
// given index and term (snapfmt.Inspect) before writing it, so a backup is
// checked when it is taken, not when it is needed; Close writes the trailer
// once every group was added. Write does all three for a File. The output is
// a function of the header and the groups' bytes.
//
// Reading: Read loads and verifies a whole file: every checksum, the group
// order and count, the trailer, the end of the input, and every group's
// snapshot decoded block by block and matched against the layout. Inspect
// verifies the same things while streaming, keeping only counts (per group
// and per tenant). Malformed input yields an error wrapping ErrCorrupt that
// names the section and field that failed; the reader never panics and
// allocates in proportion to the input it actually reads. File.CheckLayout
// tells whether a backup fits a cluster (ErrMismatch otherwise): a group
// snapshot can only be restored into the same partition/group/shard layout.
//
// Restoring is not done here: online, the server restores each group through
// its admin API; offline (disaster recovery into an empty data dir), the CLI
// seeds each group's raft snapshot store with raftnode.SeedGroup.
package backup
