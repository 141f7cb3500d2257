package backup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
	"unicode/utf8"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/layout"
)

// Magic opens every backup file (8 bytes, ASCII).
const Magic = "TGBACKUP"

// Version is the newest format version this package writes and reads.
// Version 2 is written only for a cluster whose group count was raised
// (Header.Base below Header.Groups); every other backup is written as
// version 1, byte for byte as before, so older builds still read it.
const Version = 2

// Limits enforced by both the Writer (as ErrInvalid) and the reader (as
// ErrCorrupt).
const (
	// MaxSource bounds len(Header.Source), in bytes.
	MaxSource = 1024
	// MaxGroupData bounds the snapshot of one group, in bytes (1 TiB: a
	// sanity bound; a reader allocates in proportion to the bytes it actually
	// reads, never to a declared length).
	MaxGroupData = 1 << 40
)

// Framing constants (see format.md).
const (
	headerFixed = 36 // magic(8) version(2) partitions groups shards(4 each) created(8) sections(4) sourceLen(2)
	kindGroup   = 'G'
	kindEnd     = 'E'
	frameLen    = 37 // kind(1) group(4) index(8) term(8) dataLen(8) dataCRC(4) crc(4)
	trailerLen  = 13 // kind(1) sections(4) chain(4) crc(4)
	readStep    = 1 << 20
)

// ErrCorrupt is wrapped by every error Read and Inspect return for malformed
// input: bad magic, unsupported version, checksum mismatch, truncation,
// out-of-range fields, or a group snapshot that is not a valid snapshot of
// that group. The message names the section and field that failed.
var ErrCorrupt = errors.New("backup: corrupt backup file")

// ErrVersion is wrapped (together with ErrCorrupt) when the file declares a
// format version this build cannot read.
var ErrVersion = errors.New("backup: unsupported backup version")

// ErrInvalid is wrapped by Writer errors caused by invalid input (bad header,
// groups out of order or missing, data that is not a valid snapshot of the
// group). Nothing is written to the underlying io.Writer when such an error
// is returned.
var ErrInvalid = errors.New("backup: invalid input")

// ErrMismatch is wrapped by CheckLayout when the backup was taken from a
// cluster with another partition/group/shard layout.
var ErrMismatch = errors.New("backup: layout mismatch")

// Header describes a backup.
type Header struct {
	Partitions int // P of the cluster
	Groups     int // G of the cluster (raised, if it was); the file holds one snapshot per group
	Shards     int // S of the cluster
	// Base is the group count the cluster was created with, when it was
	// raised since (1 ≤ Base < Groups): groups below it own their
	// arithmetic range of Base groups, the ones above none of their own
	// (layout.GroupSpan). 0 or Groups: never raised. Read returns Groups
	// for a cluster never raised.
	Base int
	// Created is when the backup was taken, stored with millisecond
	// precision. The zero Time is stored as 0 and read back as the zero Time
	// (so is the Unix epoch itself).
	Created time.Time
	// Source is free-form text naming where the backup comes from (cluster,
	// node, tool version): valid UTF-8, at most MaxSource bytes.
	Source string
}

// Group is one raft group's snapshot inside a backup.
type Group struct {
	Group       int
	Index, Term uint64 // raft index and term of the snapshot
	Data        []byte // the snapshot in package snapfmt's format, verbatim
}

// File is a decoded, verified backup.
type File struct {
	Header Header
	Groups []Group // one per group, Groups[g].Group == g
}

// CheckLayout returns an error wrapping ErrMismatch unless the backup was
// taken from a cluster with exactly this layout: base the group count the
// cluster was created with, groups the count it runs (base if never
// raised). Group snapshots hold the partition range and shard bits of their
// group, and group 0's the partition → group table, so a backup can only be
// restored into a cluster with the same partitions, groups and shards,
// raised from the same count.
func (f *File) CheckLayout(partitions, base, groups, shards int) error {
	h := &f.Header
	hb := h.base()
	if h.Partitions == partitions && hb == base && h.Groups == groups && h.Shards == shards {
		return nil
	}
	raised := func(base, groups int) string {
		if base == groups {
			return ""
		}
		return fmt.Sprintf(" (raised from %d)", base)
	}
	return fmt.Errorf("%w: backup was taken with partitions=%d groups=%d%s shards=%d but the cluster has partitions=%d groups=%d%s shards=%d; restore it into a cluster with the same layout",
		ErrMismatch, h.Partitions, h.Groups, raised(hb, h.Groups), h.Shards, partitions, groups, raised(base, groups), shards)
}

// base is the group count the cluster was created with.
func (h *Header) base() int {
	if h.Base == 0 {
		return h.Groups
	}
	return h.Base
}

// version is the format version h is written in.
func (h *Header) version() uint16 {
	if h.base() < h.Groups {
		return 2
	}
	return 1
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// checkHeader validates the fields both sides agree on. It returns a message
// (no prefix) or "".
func checkHeader(h *Header) string {
	if err := layout.ValidateLayout(h.Partitions, h.Groups, h.Shards); err != nil {
		return "layout: " + err.Error()
	}
	if h.Base < 0 || h.Base > h.Groups {
		return fmt.Sprintf("base = %d: the count the cluster was created with must be in [1, groups=%d]", h.Base, h.Groups)
	}
	if len(h.Source) > MaxSource {
		return fmt.Sprintf("source is %d bytes, at most %d allowed", len(h.Source), MaxSource)
	}
	if !utf8.ValidString(h.Source) {
		return "source is not valid UTF-8"
	}
	return ""
}

func createdMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func createdTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// appendHeader appends the complete header (magic through crc) of a valid h.
func appendHeader(b []byte, h *Header) []byte {
	start := len(b)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint16(b, h.version())
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Partitions))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Groups))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Shards))
	b = binary.LittleEndian.AppendUint64(b, uint64(createdMillis(h.Created)))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Groups)) // sections
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Source)))
	b = append(b, h.Source...)
	if h.version() == 2 {
		b = binary.LittleEndian.AppendUint32(b, uint32(h.Base))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// section is a decoded section frame.
type section struct {
	group       uint32
	index, term uint64
	dataLen     uint64
	dataCRC     uint32
	crc         uint32 // of the frame; chained by the trailer
}

func appendFrame(b []byte, s *section) []byte {
	start := len(b)
	b = append(b, kindGroup)
	b = binary.LittleEndian.AppendUint32(b, s.group)
	b = binary.LittleEndian.AppendUint64(b, s.index)
	b = binary.LittleEndian.AppendUint64(b, s.term)
	b = binary.LittleEndian.AppendUint64(b, s.dataLen)
	b = binary.LittleEndian.AppendUint32(b, s.dataCRC)
	s.crc = crc32.Checksum(b[start:], castagnoli)
	return binary.LittleEndian.AppendUint32(b, s.crc)
}

func appendTrailer(b []byte, sections, chain uint32) []byte {
	start := len(b)
	b = append(b, kindEnd)
	b = binary.LittleEndian.AppendUint32(b, sections)
	b = binary.LittleEndian.AppendUint32(b, chain)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

func chainAdd(chain, crc uint32) uint32 {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], crc)
	return crc32.Update(chain, castagnoli, b[:])
}

// checkSnapshot verifies that a group snapshot's header belongs to group g of
// the backup's layout at the section's index and term. It returns a message
// or "".
func checkSnapshot(h *Header, g int, index, term uint64, sh *snapfmt.Header) string {
	lo, hi := layout.GroupSpan(g, h.Partitions, h.base())
	switch {
	case int(sh.Partitions) != h.Partitions || int(sh.Shards) != h.Shards:
		return fmt.Sprintf("snapshot has partitions=%d shards=%d, backup has partitions=%d shards=%d",
			sh.Partitions, sh.Shards, h.Partitions, h.Shards)
	case int(sh.GroupLo) != lo || int(sh.GroupHi) != hi:
		return fmt.Sprintf("snapshot covers partitions [%d, %d), group %d owns [%d, %d)", sh.GroupLo, sh.GroupHi, g, lo, hi)
	case sh.Index != index || sh.Term != term:
		return fmt.Sprintf("snapshot is at index %d term %d, section says index %d term %d", sh.Index, sh.Term, index, term)
	}
	return ""
}
