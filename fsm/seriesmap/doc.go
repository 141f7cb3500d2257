// Package seriesmap is the FSM's table of active series: for one (shard,
// tenant) it maps a 64-bit series hash to a one-byte minute (minutes since the
// last 2-hour boundary; the package treats it as an opaque uint8). It is built
// for memory first, about 10-11 bytes per series where a builtin
// map[uint64]uint8 takes 30-38, and for fast inserts, refreshes and lookups.
// A Table is not safe for concurrent use; the FSM serializes writers with its
// shard locks.
//
// # Layout
//
// A Table is open addressing with keys and minutes stored apart, in one
// backing array per segment:
//
//	data: [ bucket 0: 8 keys | bucket 1: 8 keys | … | bucket nb-1 ][ minutes: 8 bytes per bucket ]
//	       ^ 64 bytes, one cache line                                ^ nb*8 bytes
//
// Key 0 marks an empty slot; the hash 0 itself is kept out of line (a flag
// and its minute in the Table), so every hash value is supported. The bucket
// count need not be a power of two: the home bucket of a hash h is
// fastrange(h*mixer, nb), the high word of (h*mixer)·nb, with mixer an odd
// constant. Hashes reaching one table share their top bits (partition range)
// and low bits (shard), so their raw bits are not usable directly; the
// multiplication spreads every bit of h into the high bits that fastrange
// reads.
//
// Probing is linear over buckets: a lookup scans the home bucket, then the
// next ones (cyclically), until it finds the hash or a bucket with an empty
// slot. An insert goes to the first empty slot of that bucket. Hence the
// invariant: an entry in bucket p with home bucket h has every bucket of the
// cyclic range [h, p) full.
//
// # Load and growth
//
// A segment grows when an insert would take it past 95% full. It grows by at
// most 1.2× (1.25× past 32 KB; doubling below 1 KB, where the fixed per-table
// cost dominates), into an allocation that exactly fills one of the Go
// allocator's size classes (probed at init) or whole pages: the capacity the
// allocator returns is used in full, as cap/9 buckets of 9 words. The load
// thus stays between 76% and 95%, 9.5 to 11.85 bytes per series plus a
// 48-byte Table struct (TestMemoryBound checks the total stays ≤ 12 from 140
// series on). A segment left under 40% full by a cleanup is rebuilt for 80%.
//
// A large table is split into segments (extendible hashing): a directory of
// 2^depth segment pointers indexed by the top bits of h*mixer, each segment
// holding the hashes of one prefix of local depth ld ≤ depth and computing
// home buckets from the bits below it. A segment that would grow past 256 KB
// splits in two by its next prefix bit instead, the directory doubling when
// needed; buddy segments left small by cleanups merge again. So a big table
// grows in small steps that are rebuilt within the CPU caches, never by
// rehashing everything at once. Arrays freed by rebuilds are recycled
// through per-size sync.Pools. A table of up to ~30,000 series is a single
// segment with no directory.
//
// # Cleanup
//
// Cleanup removes the series whose minute is marked expired, in place,
// without rehashing everything. Removing entries leaves holes that can break
// the probing invariant for entries displaced past them. One pass restores it:
// start just after a bucket f that had a free slot before the removal (no
// probe path crosses from f to f+1), then walk all buckets cyclically from
// there, moving each entry not in its home bucket back to the first bucket
// with a free slot between its home and its position. Entries only move
// towards home, into buckets already walked, so the walk never breaks what it
// has fixed. (The full argument is at seg.cleanup.) Then underfull segments
// are rebuilt smaller.
//
// # Bulk build
//
// A snapshot restore builds every table of a group from its hashes, stored
// ascending. Put for each would miss the cache on every key of a table larger
// than the caches (ascending hashes land on random buckets). FromSorted
// instead counts the keys per segment of the directory the table will have,
// copies them into one contiguous run per segment, and fills each segment from
// its run, so the random writes stay inside one segment's array: about 5×
// less time per key at 1.5 M series (BenchmarkRestore). Segments are sized
// at 95% full, as New sizes a table, and each is at most 85% of the size
// limit, so they grow one at a time as inserts arrive. Input that is not
// strictly ascending is refused, never stored twice.
package seriesmap
