package snapfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Magic opens every snapshot file (6 bytes, ASCII).
const Magic = "TGSNAP"

// Version is the newest format version this package reads and writes.
// Version 2 adds section blocks (named opaque payloads after the shard blocks);
// a Writer whose Header.Version is 0 or 1 writes version 1, byte for byte as
// before, so a file without sections stays readable by version-1 builds.
const Version = 2

// Limits enforced by both the Writer (as ErrInvalid) and the Reader (as
// ErrCorrupt). They bound what a reader allocates before a checksum has been
// verified, and are generous for real clusters.
const (
	// MaxShards bounds Header.Shards (a power of two).
	MaxShards = 1 << 16
	// MaxMetaSize bounds len(Header.Meta).
	MaxMetaSize = 16 << 20
	// MaxTenants bounds len(Header.Tenants).
	MaxTenants = 1 << 20
	// MaxTenantNameLen bounds the length of one tenant name, in bytes.
	MaxTenantNameLen = 1 << 10
	// MaxHeaderBody bounds the encoded header body (fields, meta, tenant names).
	MaxHeaderBody = 64 << 20
	// MaxBlockSeries bounds the series held by one shard block.
	MaxBlockSeries = 1 << 30
	// MaxPayload bounds the payload of one shard block, in bytes.
	MaxPayload = 1<<31 - 1
	// MaxSections bounds the section blocks of one file.
	MaxSections = 64
	// MaxSectionName bounds a section name, in bytes.
	MaxSectionName = 64
	// MaxMinute is the largest valid minute value (the FSM's clock is a
	// 120-minute ring, values 0..119).
	MaxMinute = 119
)

// Framing constants (see format.md).
const (
	headerFixed  = 12 // magic(6) version(2) bodyLen(4)
	headerFields = 32 // partitions shards groupLo groupHi (4 each) index term (8 each)
	kindShard    = 'S'
	kindEnd      = 'E'
	kindSection  = 'X'
	frameLen     = 13 // kind(1) shard(4) payloadLen(4) crc(4)
	trailerLen   = 21 // kind(1) blocks(4) series(8) chain(4) crc(4)
	minuteChunk  = 1 << 17
	padding      = 16 // zero bytes kept after a decoded payload for 8-byte loads

	modeRaw    = 0
	modeRLE    = 1
	modeHuff4X = 2
	modeHuff1X = 3
)

// ErrCorrupt is wrapped by every error the Reader returns for malformed input:
// bad magic, unsupported version, checksum mismatch, truncation, out-of-range
// fields. The message names the block and the field that failed.
var ErrCorrupt = errors.New("snapfmt: corrupt snapshot")

// ErrVersion is wrapped (together with ErrCorrupt) when the file declares a
// format version this build cannot read.
var ErrVersion = errors.New("snapfmt: unsupported snapshot version")

// ErrInvalid is wrapped by Writer errors caused by invalid input (a hash in the
// wrong shard, a duplicate hash, a minute > MaxMinute, a bad header...). Nothing
// is written to the underlying io.Writer when such an error is returned, and the
// Writer stays usable.
var ErrInvalid = errors.New("snapfmt: invalid input")

// Header describes a snapshot. It is written once at the start of the file.
type Header struct {
	// Version is the format version: 0 or 1 write (and a version-1 file reads
	// as) version 1, which cannot hold sections; 2 allows WriteSection.
	Version          uint16
	Partitions       uint32 // P of the cluster, ≥ 1
	Shards           uint32 // S, a power of two in [1, MaxShards]
	GroupLo, GroupHi uint32 // arithmetic partition range [lo, hi) of the group, lo < hi ≤ P, or [0, 0) for a group a raise added
	Index, Term      uint64 // raft index/term of the snapshot
	Meta             []byte // opaque FSM state, ≤ MaxMetaSize bytes
	Tenants          []string
	// Tenants are the tenant names TenantSeries.Tenant indexes: distinct,
	// 1..MaxTenantNameLen bytes each, at most MaxTenants of them.
}

// TenantSeries is the series of one tenant within one shard.
type TenantSeries struct {
	Tenant  uint32   // index into Header.Tenants
	Hashes  []uint64 // distinct; any order on write, ascending on read
	Minutes []uint8  // parallel to Hashes, each ≤ MaxMinute
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// lowBits returns the Elias-Fano low-part width for m values in [0, u), u ≥ m ≥ 1.
func lowBits(u, m uint64) uint {
	return uint(bits.Len64(u/m)) - 1
}

// efSizes returns the byte sizes of the low and high parts of an Elias-Fano
// sequence of m values in [0, u) with l low bits, and the bit length of the
// high part.
func efSizes(u, m uint64, l uint) (lowLen, highLen, highBits uint64) {
	lowLen = (m*uint64(l) + 7) / 8
	highBits = (u-1)>>l + m
	return lowLen, (highBits + 7) / 8, highBits
}

// checkHeader validates the fields both sides agree on. It returns a message
// (no prefix) or "".
func checkHeader(h *Header) string {
	switch {
	case h.Version > Version:
		return fmt.Sprintf("version %d: this build writes at most %d", h.Version, Version)
	case h.Partitions < 1:
		return "partitions = 0"
	case h.Shards < 1 || h.Shards > MaxShards || h.Shards&(h.Shards-1) != 0:
		return fmt.Sprintf("shards = %d: must be a power of two in [1, %d]", h.Shards, MaxShards)
	case h.GroupLo > h.GroupHi || h.GroupHi > h.Partitions || h.GroupLo == h.GroupHi && h.GroupLo != 0:
		// Empty only as [0, 0): a group a raise added owns no arithmetic
		// range (layout.GroupSpan); what it owns is fsm/partmove's state.
		return fmt.Sprintf("group partitions [%d, %d) not a range within [0, %d) (empty only as [0, 0))", h.GroupLo, h.GroupHi, h.Partitions)
	case len(h.Meta) > MaxMetaSize:
		return fmt.Sprintf("meta is %d bytes, at most %d allowed", len(h.Meta), MaxMetaSize)
	case len(h.Tenants) > MaxTenants:
		return fmt.Sprintf("%d tenants, at most %d allowed", len(h.Tenants), MaxTenants)
	}
	seen := make(map[string]struct{}, len(h.Tenants))
	for i, t := range h.Tenants {
		if len(t) < 1 || len(t) > MaxTenantNameLen {
			return fmt.Sprintf("tenant %d name is %d bytes, must be 1..%d", i, len(t), MaxTenantNameLen)
		}
		if _, dup := seen[t]; dup {
			return fmt.Sprintf("tenant %d name %q listed twice", i, t)
		}
		seen[t] = struct{}{}
	}
	return ""
}

// appendHeader appends the complete header frame (magic through crc).
func appendHeader(b []byte, h *Header) []byte {
	start := len(b)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint16(b, max(h.Version, 1))
	b = binary.LittleEndian.AppendUint32(b, 0) // body length, patched below
	body := len(b)
	b = binary.LittleEndian.AppendUint32(b, h.Partitions)
	b = binary.LittleEndian.AppendUint32(b, h.Shards)
	b = binary.LittleEndian.AppendUint32(b, h.GroupLo)
	b = binary.LittleEndian.AppendUint32(b, h.GroupHi)
	b = binary.LittleEndian.AppendUint64(b, h.Index)
	b = binary.LittleEndian.AppendUint64(b, h.Term)
	w := wire.Encoder{Buf: b}
	w.Bytes(h.Meta)
	w.Uvarint(uint64(len(h.Tenants)))
	for _, t := range h.Tenants {
		w.String(t)
	}
	b = w.Buf
	binary.LittleEndian.PutUint32(b[body-4:], uint32(len(b)-body))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// parseHeaderBody decodes a header body whose checksum was verified.
func parseHeaderBody(body []byte) (Header, error) {
	var h Header
	if len(body) < headerFields {
		return h, corruptf("header: body is %d bytes, fixed fields need %d", len(body), headerFields)
	}
	h.Partitions = binary.LittleEndian.Uint32(body[0:])
	h.Shards = binary.LittleEndian.Uint32(body[4:])
	h.GroupLo = binary.LittleEndian.Uint32(body[8:])
	h.GroupHi = binary.LittleEndian.Uint32(body[12:])
	h.Index = binary.LittleEndian.Uint64(body[16:])
	h.Term = binary.LittleEndian.Uint64(body[24:])
	// Offsets in errors count from the start of the body.
	d := wire.NewDecoder(body, ErrCorrupt)
	d.Raw("header fields", headerFields) // read above
	if meta := d.Bytes("header meta", MaxMetaSize); len(meta) > 0 {
		h.Meta = append([]byte(nil), meta...)
	}
	count := d.Count("header tenant count", MaxTenants)
	// Each name takes at least two bytes, which bounds the allocation.
	if count > d.Len()/2 {
		d.Failf("header tenant count %d: %d bytes left cannot hold the names", count, d.Len())
	}
	if count > 0 && d.Err() == nil {
		h.Tenants = make([]string, count)
	}
	for i := range h.Tenants {
		h.Tenants[i] = d.String("header tenant name", MaxTenantNameLen)
	}
	if err := d.Finish(); err != nil {
		return h, err
	}
	if msg := checkHeader(&h); msg != "" {
		return h, corruptf("header: %s", msg)
	}
	return h, nil
}

// Section is a named opaque payload carried after the shard blocks (format
// version 2): the state of an FSM module (see fsm.Module).
type Section struct {
	Name    string
	Payload []byte
}

// checkSectionName returns a message (no prefix) or "" when name is valid:
// 1..MaxSectionName bytes of [a-z0-9-].
func checkSectionName(name string) string {
	if len(name) < 1 || len(name) > MaxSectionName {
		return fmt.Sprintf("section name %q is %d bytes, must be 1..%d", name, len(name), MaxSectionName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Sprintf("section name %q: byte %d is not one of [a-z0-9-]", name, i)
		}
	}
	return ""
}
