// Package wal is one write-ahead log shared by all raft groups of a node,
// with group commit: whatever the groups append while one write is being
// made durable goes into the next write, and that write costs one
// fdatasync for all of them. Each group sees its own raft.LogStore
// (WAL.Group).
//
// Why: bbolt commits a transaction with two fdatasyncs, and each group
// commits once per batch it appends, so a node with G groups paid 2·G
// fdatasyncs per round of batches (measurements in BENCHMARKS.md).
//
// # Files
//
// The log is a directory of segment files named <seq>.wal (16 hex digits,
// in write order) and a LOCK file (flock: one process at a time). A new
// segment is started once the active one passes SegmentSize; a segment is
// deleted once every entry it holds is dead (compacted or truncated) and
// every older segment is deleted too, so that a record that voids entries
// is never deleted before the entries it voids. raft never compacts a group
// that stopped appending, so the groups still holding live entries in the
// oldest segment have their whole log copied to the end (one frame: a
// compact-through of the group's last index, then the same entry records)
// once the files hold more than twice the live entries plus two segments:
// disk use stays within about twice the live log, and no more is copied
// than is freed.
//
// Byte format, all integers little-endian:
//
//	segment  = header frame* zero*
//	header   = "TGWAL\x00\x00\x01" (8 bytes) | seq u64
//	frame    = len u32 | crc u32 | hcrc u32 | payload (len bytes)
//	             crc:  CRC-32C of payload
//	             hcrc: CRC-32C of the first 8 bytes of the frame
//	payload  = record*
//	record   = blen u32 | bcrc u32 | body (blen bytes)
//	             bcrc: CRC-32C of body
//	body     = group u16 | kind u8 | type u8 | index u64 | term u64 |
//	           appendedAt i64 (unix ns) | extLen u32 | ext | data
//
// A frame is what one group-commit round wrote with one write and one
// fdatasync. The zeros after the last frame are written ahead
// (Options.ZeroAhead, 256 KB by default, never past SegmentSize) by the
// round whose frame grows the file: later rounds then overwrite zeros in
// place, and an fdatasync that does not change the file's length flushes
// data without a journal commit (on ext4 about 40 % less CPU and half the
// time per round). A frame header is never all zeros (its header checksum
// of eight zero bytes is not zero), so zeros where a frame would start end
// a segment's frames unambiguously. A finished segment, and the active one
// at Close, is cut back to its last frame (a previous release reads zeros
// as a torn write, and as corruption in any segment but the last). Record kinds: 1 entry (a raft.Log), 2 truncate-after (entries
// after index are void: a follower's log conflict), 3 compact-through
// (entries up to index are void: compaction after a snapshot). A record's
// own CRC lets a single entry be read back and checked without its frame
// (GetLog of an entry no longer in raft's LogCache).
//
// # Durability
//
// An append or delete is acknowledged once its frame is written and
// fdatasync'd. A file's name is no more durable than its bytes: until the
// directory is fsync'd, a power cut may take a new file away or bring a
// removed one back, in any order. So the log
//
//   - syncs a new segment's header, then the directory, before it writes a
//     frame to it (a segment that vanished would take acknowledged frames);
//   - removes dead segments oldest first and syncs the directory after each
//     removal before the next: at most the oldest file left can come back,
//     so the files are always a run of consecutive segments, and no
//     segment returns without the newer ones holding the records that void
//     its entries;
//   - syncs the parent of the log directory (and of any parent it creates)
//     when it creates it.
//
// There are no renames. Open refuses a hole in the segment numbers
// (ErrCorrupt naming the missing segment): with these rules it means a
// lost file, not a leftover one.
//
// # Recovery
//
// Open replays every segment in order. Within a group, an entry must
// follow the group's last live entry, or start a group whose log is empty
// (after raft removed all of it following a snapshot install: the store is
// a raft.MonotonicLogStore). A bad frame at the end of the last segment is
// a write that was torn by a crash and never acknowledged: it is cut off
// and reported (Recovered). Zeros from a frame boundary to the end of a
// file are the written-ahead zeros (or a round none of which reached the
// disk): the frames end there, in any segment. A bad frame anywhere else,
// or one followed by a valid frame, is corruption: Open fails and names the
// file and offset.
//
// # Errors
//
// A round whose write or fdatasync fails is cut off the file again
// (ftruncate to where it began), and every append or delete in it fails
// with the error; the log is unchanged, and the next round tries again. So
// a full disk fails writes while it is full and the log carries on once
// space is freed.
package wal
