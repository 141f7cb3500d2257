package backup

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// Read reads and fully verifies a backup file: the header, every checksum,
// the order and count of the groups, the trailer and the end of the input,
// and that each group's data is a valid snapfmt snapshot (every block
// decoded, as a restore would) of that group of the backup's layout at the
// section's index and term. Malformed input returns an error wrapping
// ErrCorrupt that names what is wrong; a failure of r itself is returned
// wrapped as is.
//
// The whole file is held in memory (the group snapshots, verbatim). Lengths
// read from the file are never trusted for allocation: buffers grow with the
// bytes actually read.
func Read(r io.Reader) (*File, error) {
	rd, err := newReader(r)
	if err != nil {
		return nil, err
	}
	f := &File{Header: rd.h, Groups: make([]Group, 0, min(rd.h.Groups, 1024))}
	for {
		s, err := rd.nextSection()
		if err == io.EOF {
			return f, nil
		}
		if err != nil {
			return nil, err
		}
		g := int(s.group)
		data, err := rd.readData(int(s.dataLen), g)
		if err != nil {
			return nil, err
		}
		if sum := crc32.Checksum(data, castagnoli); sum != s.dataCRC {
			return nil, corruptf("group %d: snapshot data checksum mismatch (stored %08x, computed %08x)", g, s.dataCRC, sum)
		}
		sum, err := snapfmt.Inspect(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("%w: group %d: snapshot data: %w", ErrCorrupt, g, err)
		}
		if msg := checkSnapshot(&rd.h, g, s.index, s.term, &sum.Header); msg != "" {
			return nil, corruptf("group %d: %s", g, msg)
		}
		f.Groups = append(f.Groups, Group{Group: g, Index: s.index, Term: s.term, Data: data})
	}
}

// reader decodes the framing of a backup file: the header, the section
// frames and the trailer. The caller consumes each section's data between
// calls to nextSection.
type reader struct {
	r     io.Reader
	h     Header
	off   int64  // bytes consumed
	next  int    // sections read
	chain uint32 // header crc, then every section frame crc
	frame [frameLen]byte
}

func newReader(r io.Reader) (*reader, error) {
	rd := &reader{r: r}
	var fixed [headerFixed]byte
	if err := rd.readFull(fixed[:], "header"); err != nil {
		return nil, err
	}
	if string(fixed[:8]) != Magic {
		return nil, corruptf("header: bad magic %q, want %q (not a Tollgate backup file)", fixed[:8], Magic)
	}
	v := binary.LittleEndian.Uint16(fixed[8:])
	if v != 1 && v != 2 {
		return nil, fmt.Errorf("%w: %w: file has format version %d, this build reads versions 1 and %d", ErrCorrupt, ErrVersion, v, Version)
	}
	srcLen := int(binary.LittleEndian.Uint16(fixed[34:]))
	if srcLen > MaxSource {
		return nil, corruptf("header: source length %d exceeds %d", srcLen, MaxSource)
	}
	extra := 0 // version 2: the base group count follows the source
	if v == 2 {
		extra = 4
	}
	rest := make([]byte, srcLen+extra+4)
	if err := rd.readFull(rest, "header"); err != nil {
		return nil, err
	}
	stored := binary.LittleEndian.Uint32(rest[srcLen+extra:])
	sum := crc32.Update(crc32.Checksum(fixed[:], castagnoli), castagnoli, rest[:srcLen+extra])
	if sum != stored {
		return nil, corruptf("header: checksum mismatch (stored %08x, computed %08x)", stored, sum)
	}
	u32 := func(off int) int { return int(binary.LittleEndian.Uint32(fixed[off:])) }
	h := Header{
		Partitions: u32(10),
		Groups:     u32(14),
		Shards:     u32(18),
		Created:    createdTime(int64(binary.LittleEndian.Uint64(fixed[22:]))),
		Source:     string(rest[:srcLen]),
		Base:       u32(14),
	}
	if v == 2 {
		h.Base = int(binary.LittleEndian.Uint32(rest[srcLen:]))
		if h.Base < 1 || h.Base >= h.Groups {
			// Version 2 is written for a raised cluster only: one encoding per file.
			return nil, corruptf("header: version 2 with base %d for %d groups (base must be in [1, groups))", h.Base, h.Groups)
		}
	}
	if msg := checkHeader(&h); msg != "" {
		return nil, corruptf("header: %s", msg)
	}
	if n := u32(30); n != h.Groups {
		return nil, corruptf("header: %d sections declared for %d groups (a backup holds every group)", n, h.Groups)
	}
	rd.h = h
	rd.chain = crc32.Update(0, castagnoli, rest[srcLen+extra:])
	return rd, nil
}

// nextSection reads and verifies the next section frame, or, after the last
// section, the trailer and the end of the input (returning io.EOF).
func (rd *reader) nextSection() (section, error) {
	var s section
	start := rd.off
	n, err := io.ReadFull(rd.r, rd.frame[:1])
	rd.off += int64(n)
	if err == io.EOF {
		return s, corruptf("section %d at offset %d: unexpected end of input, trailer missing (%d of %d groups read): %w",
			rd.next, start, rd.next, rd.h.Groups, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return s, fmt.Errorf("backup: reading section %d at offset %d: %w", rd.next, start, err)
	}
	switch rd.frame[0] {
	case kindGroup:
	case kindEnd:
		return s, rd.readTrailer(start)
	default:
		return s, corruptf("section %d at offset %d: unknown section kind %#02x", rd.next, start, rd.frame[0])
	}
	f := rd.frame[:]
	if err := rd.readFull(f[1:], fmt.Sprintf("section %d frame", rd.next)); err != nil {
		return s, err
	}
	s = section{
		group:   binary.LittleEndian.Uint32(f[1:]),
		index:   binary.LittleEndian.Uint64(f[5:]),
		term:    binary.LittleEndian.Uint64(f[13:]),
		dataLen: binary.LittleEndian.Uint64(f[21:]),
		dataCRC: binary.LittleEndian.Uint32(f[29:]),
		crc:     binary.LittleEndian.Uint32(f[33:]),
	}
	if sum := crc32.Checksum(f[:33], castagnoli); sum != s.crc {
		return s, corruptf("section %d at offset %d: frame checksum mismatch (stored %08x, computed %08x)", rd.next, start, s.crc, sum)
	}
	switch {
	case rd.next >= rd.h.Groups:
		return s, corruptf("section %d at offset %d: group %d after the last of %d groups", rd.next, start, s.group, rd.h.Groups)
	case s.group != uint32(rd.next):
		return s, corruptf("section %d at offset %d: holds group %d, want group %d (groups are stored in order, each once)", rd.next, start, s.group, rd.next)
	case s.dataLen == 0 || s.dataLen > MaxGroupData || s.dataLen > math.MaxInt:
		return s, corruptf("group %d at offset %d: data length %d out of range [1, %d]", s.group, start, s.dataLen, min(uint64(MaxGroupData), uint64(math.MaxInt)))
	}
	rd.chain = chainAdd(rd.chain, s.crc)
	rd.next++
	return s, nil
}

func (rd *reader) readTrailer(start int64) error {
	t := rd.frame[:trailerLen]
	if err := rd.readFull(t[1:], "trailer"); err != nil {
		return err
	}
	if sum, stored := crc32.Checksum(t[:9], castagnoli), binary.LittleEndian.Uint32(t[9:]); sum != stored {
		return corruptf("trailer at offset %d: checksum mismatch (stored %08x, computed %08x)", start, stored, sum)
	}
	if n := binary.LittleEndian.Uint32(t[1:]); n != uint32(rd.next) {
		return corruptf("trailer at offset %d: declares %d sections, file has %d", start, n, rd.next)
	}
	if rd.next != rd.h.Groups {
		return corruptf("trailer at offset %d: after %d groups, backup has %d: groups %d..%d missing", start, rd.next, rd.h.Groups, rd.next, rd.h.Groups-1)
	}
	if c := binary.LittleEndian.Uint32(t[5:]); c != rd.chain {
		return corruptf("trailer at offset %d: checksum chain mismatch (stored %08x, computed %08x): sections missing, repeated or reordered", start, c, rd.chain)
	}
	var one [1]byte
	n, err := io.ReadFull(rd.r, one[:])
	if n > 0 {
		return corruptf("unexpected data after the trailer at offset %d", rd.off)
	}
	if err != io.EOF {
		return fmt.Errorf("backup: reading after the trailer: %w", err)
	}
	return io.EOF
}

// readFull reads exactly len(p) bytes; a short read is corruption (truncation).
func (rd *reader) readFull(p []byte, what string) error {
	start := rd.off
	n, err := io.ReadFull(rd.r, p)
	rd.off += int64(n)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return corruptf("%s at offset %d: truncated (%d of %d bytes): %w", what, start, n, len(p), io.ErrUnexpectedEOF)
	}
	if err != nil {
		return fmt.Errorf("backup: reading %s at offset %d: %w", what, start, err)
	}
	return nil
}

// readData reads a section's n data bytes, growing the buffer with the data
// actually read rather than trusting n up front.
func (rd *reader) readData(n, group int) ([]byte, error) {
	var dst []byte
	what := fmt.Sprintf("group %d data", group)
	for len(dst) < n {
		step := min(n-len(dst), max(len(dst), readStep))
		dst = slices.Grow(dst, step)
		if err := rd.readFull(dst[len(dst):len(dst)+step], what); err != nil {
			return nil, err
		}
		dst = dst[:len(dst)+step]
	}
	return dst, nil
}
