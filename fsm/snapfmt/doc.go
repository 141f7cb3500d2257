// Package snapfmt is Tollgate's raft snapshot file format: an encoder (Writer),
// a verifying decoder (Reader) and Inspect, which summarizes a snapshot without
// keeping its series.
//
// A snapshot holds one raft group's FSM state: a Header (cluster layout, raft
// index and term, opaque FSM metadata, tenant names) and, per shard, the series
// of each tenant: distinct 64-bit hashes with a one-byte minute (0..119). The
// byte format is documented field by field in format.md; in short:
//
//	header   magic "TGSNAP", version, fields, meta, tenant names, crc32c
//	block*   per shard: kind 'S', shard, payload length, crc32c, payload
//	trailer  kind 'E', block count, series count, crc chain, crc32c
//
// A block payload stores, per tenant, the hashes shifted right by log2(Shards)
// (the shard bits are implied) as the minimum, the range and an Elias-Fano code
// of the inner values, followed by the block's minutes in hash order, Huffman
// coded (huff0) in chunks of 2^17. For 10M random hashes of one group in 16
// shards this is ~5.63 bytes/series (~5.08 for the hashes, ~0.55 for minutes
// spread over 20 minutes).
//
// Writing: NewWriter writes the header; WriteShard sorts and encodes one shard
// (counting sort by the Elias-Fano high bits, then insertion sort of the small
// buckets, with slices.Sort for adversarial buckets) without modifying its
// input; Close writes the trailer. The output is deterministic: it depends on
// the set of series, not on their order.
//
// Reading: NewReader verifies the header; Next verifies and decodes one block
// at a time and returns io.EOF after a verified trailer. Slices returned by
// Next are reused by the following call. Every malformed input yields an error
// wrapping ErrCorrupt naming the block and field that failed; the reader never
// panics and allocates in proportion to the input it actually reads.
package snapfmt
