// Package wire is the byte-level primitives every FSM payload and snapshot
// section uses: log entries (fsm/entry.go), the FSM's snapshot meta, the
// snapfmt header, and the payloads and sections of the FSM modules
// (fsm/runtimecfg, fsm/shares, fsm/metering). Each of those formats is
// documented next to its code; this package only fixes how their fields are
// written and read.
//
// The field encodings:
//
//	uvarint   unsigned LEB128 (encoding/binary), minimal: at most 10 bytes,
//	          and the last byte of a multi-byte varint is never 0x00
//	varint    zig-zag signed value as a uvarint (encoding/binary), minimal
//	byte      one byte; bool is a byte 0 or 1
//	uint64    8 bytes little-endian; float64 is its IEEE-754 bits as a uint64
//	string    uvarint length, then the bytes (bytes: the same)
//
// Encoder appends these to a byte slice and always writes the minimal form,
// byte for byte what encoding/binary writes. Decoder reads them back and
// refuses a non-minimal varint: an honest encoder never writes one, and
// refusing it gives every accepted payload exactly one byte form, so a
// decoded value re-encodes to the bytes it came from (replicas compare and
// checksum bytes, not values).
//
// A Decoder keeps the first error and turns every later read into a no-op
// returning zero, so a format decoder reads its fields straight through and
// checks once. The error (*Error) wraps the caller's sentinel (ErrBadEntry,
// ErrBadPayload, ...) and one of this package's, and names the field and its
// byte offset. Lengths and counts are bounded twice before anything is
// allocated: by the caller's maximum and by the bytes left, so a corrupt
// length cannot make a reader allocate more than its input holds.
package wire
