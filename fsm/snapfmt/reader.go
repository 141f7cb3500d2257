package snapfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"slices"

	"github.com/klauspost/compress/huff0"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// readStep is the first allocation step when reading a length-prefixed region:
// buffers grow with the bytes actually read, so a corrupt length cannot make the
// reader allocate much more than the input holds.
const readStep = 1 << 20

// Reader decodes a snapshot. It is not safe for concurrent use.
//
// Every block is verified (checksum, bounds, ordering, shard ownership) before
// Next returns it. The TenantSeries slice and the Hashes and Minutes slices
// returned by Next are owned by the Reader and valid only until the next call
// to Next: copy what must be kept.
type Reader struct {
	r      io.Reader
	h      Header
	k      uint   // log2(Shards)
	vmax   uint64 // largest hash >> k
	off    int64  // bytes consumed
	seen   []bool
	blocks uint32
	series uint64
	chain  uint32
	done   bool
	err    error // sticky

	sections []Section

	frame   [trailerLen]byte
	buf     []byte
	hashes  []uint64
	minutes []byte
	out     []TenantSeries
	huff    *huff0.Scratch
}

// NewReader reads and verifies the snapshot header.
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{r: r}
	var fixed [headerFixed]byte
	if err := rd.readFull(fixed[:], "header"); err != nil {
		return nil, err
	}
	if string(fixed[:6]) != Magic {
		return nil, corruptf("header: bad magic %q, want %q", fixed[:6], Magic)
	}
	v := binary.LittleEndian.Uint16(fixed[6:])
	if v < 1 || v > Version {
		return nil, fmt.Errorf("%w: %w: file has format version %d, this build reads versions 1 to %d", ErrCorrupt, ErrVersion, v, Version)
	}
	bodyLen := binary.LittleEndian.Uint32(fixed[8:])
	if bodyLen > MaxHeaderBody {
		return nil, corruptf("header: body length %d exceeds %d", bodyLen, MaxHeaderBody)
	}
	buf, err := rd.readGrow(nil, int(bodyLen)+4, "header")
	if err != nil {
		return nil, err
	}
	body := buf[:bodyLen]
	stored := binary.LittleEndian.Uint32(buf[bodyLen:])
	if sum := crc32.Update(crc32.Checksum(fixed[:], castagnoli), castagnoli, body); sum != stored {
		return nil, corruptf("header: checksum mismatch (stored %08x, computed %08x)", stored, sum)
	}
	h, err := parseHeaderBody(body)
	if err != nil {
		return nil, err
	}
	h.Version = v
	rd.h = h
	rd.k = uint(bits.TrailingZeros32(h.Shards))
	rd.vmax = ^uint64(0) >> rd.k
	rd.seen = make([]bool, h.Shards)
	rd.chain = crc32.Update(0, castagnoli, buf[bodyLen:])
	return rd, nil
}

// Header returns the snapshot header. Its slices must not be modified.
func (r *Reader) Header() Header { return r.h }

// Sections returns the section blocks (format version 2), verified, in file
// order (ascending names). They follow every shard block, so the list is
// complete once Next has returned io.EOF; before that it holds what was read.
func (r *Reader) Sections() []Section { return r.sections }

// Next returns the next shard block: the shard and its series, ordered by
// tenant index, each with hashes ascending and minutes in hash order. After the
// last block it verifies the trailer and the end of the input and returns
// io.EOF. Malformed input returns an error wrapping ErrCorrupt; a failure of
// the underlying reader is returned wrapped as is. Errors are sticky.
func (r *Reader) Next() (shard uint32, series []TenantSeries, err error) {
	if r.err != nil {
		return 0, nil, r.err
	}
	if r.done {
		return 0, nil, io.EOF
	}
	shard, series, err = r.next()
	switch {
	case err == io.EOF:
		r.done = true
	case err != nil:
		r.err = err
	}
	return shard, series, err
}

func (r *Reader) next() (uint32, []TenantSeries, error) {
	start := r.off
	n, err := io.ReadFull(r.r, r.frame[:1])
	r.off += int64(n)
	if err != nil {
		if err == io.EOF {
			return 0, nil, corruptf("block %d at offset %d: unexpected end of input, trailer missing: %w", r.blocks, start, io.ErrUnexpectedEOF)
		}
		return 0, nil, fmt.Errorf("snapfmt: reading block %d at offset %d: %w", r.blocks, start, err)
	}
	switch r.frame[0] {
	case kindShard:
		if len(r.sections) > 0 {
			return 0, nil, corruptf("block %d at offset %d: shard block after a section block", r.blocks, start)
		}
		return r.readBlock(start)
	case kindSection:
		if r.h.Version < 2 {
			return 0, nil, corruptf("block %d at offset %d: section block in a version %d file", r.blocks, start, r.h.Version)
		}
		if err := r.readSection(start); err != nil {
			return 0, nil, err
		}
		return r.next()
	case kindEnd:
		return 0, nil, r.readTrailer(start)
	default:
		return 0, nil, corruptf("block %d at offset %d: unknown block kind %#02x", r.blocks, start, r.frame[0])
	}
}

func (r *Reader) readBlock(start int64) (uint32, []TenantSeries, error) {
	f := r.frame[:frameLen]
	if err := r.readFull(f[1:], "block frame"); err != nil {
		return 0, nil, err
	}
	shard := binary.LittleEndian.Uint32(f[1:])
	plen := binary.LittleEndian.Uint32(f[5:])
	stored := binary.LittleEndian.Uint32(f[9:])
	where := func() string { return fmt.Sprintf("block %d (shard %d) at offset %d", r.blocks, shard, start) }
	if shard >= r.h.Shards {
		return 0, nil, corruptf("%s: shard out of range [0, %d)", where(), r.h.Shards)
	}
	if r.seen[shard] {
		return 0, nil, corruptf("%s: shard repeated", where())
	}
	if plen == 0 || plen > MaxPayload {
		return 0, nil, corruptf("%s: payload length %d out of range [1, %d]", where(), plen, MaxPayload)
	}
	buf, err := r.readGrow(r.buf[:0], int(plen), where()+": payload")
	r.buf = buf[:0]
	if err != nil {
		return 0, nil, err
	}
	if sum := crc32.Update(crc32.Checksum(f[:9], castagnoli), castagnoli, buf); sum != stored {
		return 0, nil, corruptf("%s: block checksum mismatch (stored %08x, computed %08x)", where(), stored, sum)
	}
	buf = slices.Grow(buf, padding)[:len(buf)+padding]
	clear(buf[plen:])
	r.buf = buf[:0]
	total, err := r.decodePayload(shard, buf, int(plen))
	if err != nil {
		return 0, nil, corruptf("%s: %s", where(), err.Error())
	}
	r.seen[shard] = true
	r.blocks++
	r.series += total
	r.chain = crc32.Update(r.chain, castagnoli, f[9:13])
	return shard, r.out, nil
}

// readSection reads and verifies one section block (its kind byte consumed).
func (r *Reader) readSection(start int64) error {
	where := fmt.Sprintf("block %d (section) at offset %d", r.blocks, start)
	if len(r.sections) >= MaxSections {
		return corruptf("%s: more than %d sections", where, MaxSections)
	}
	var nl [1]byte
	if err := r.readFull(nl[:], where+": name length"); err != nil {
		return err
	}
	frame := make([]byte, 0, 2+int(nl[0])+8)
	frame = append(frame, kindSection, nl[0])
	frame = frame[:2+int(nl[0])+8]
	if err := r.readFull(frame[2:], where+": frame"); err != nil {
		return err
	}
	name := string(frame[2 : 2+int(nl[0])])
	if msg := checkSectionName(name); msg != "" {
		return corruptf("%s: %s", where, msg)
	}
	where = fmt.Sprintf("block %d (section %q) at offset %d", r.blocks, name, start)
	if n := len(r.sections); n > 0 && name <= r.sections[n-1].Name {
		return corruptf("%s: section names not distinct and ascending (after %q)", where, r.sections[n-1].Name)
	}
	plen := binary.LittleEndian.Uint32(frame[2+len(name):])
	stored := binary.LittleEndian.Uint32(frame[6+len(name):])
	if plen > MaxPayload {
		return corruptf("%s: payload length %d exceeds %d", where, plen, MaxPayload)
	}
	payload, err := r.readGrow(nil, int(plen), where+": payload")
	if err != nil {
		return err
	}
	if sum := crc32.Update(crc32.Checksum(frame[:6+len(name)], castagnoli), castagnoli, payload); sum != stored {
		return corruptf("%s: checksum mismatch (stored %08x, computed %08x)", where, stored, sum)
	}
	r.sections = append(r.sections, Section{Name: name, Payload: payload})
	r.blocks++
	r.chain = crc32.Update(r.chain, castagnoli, frame[6+len(name):])
	return nil
}

func (r *Reader) readTrailer(start int64) error {
	t := r.frame[:trailerLen]
	if err := r.readFull(t[1:], "trailer"); err != nil {
		return err
	}
	if sum, stored := crc32.Checksum(t[:17], castagnoli), binary.LittleEndian.Uint32(t[17:]); sum != stored {
		return corruptf("trailer at offset %d: checksum mismatch (stored %08x, computed %08x)", start, stored, sum)
	}
	if b := binary.LittleEndian.Uint32(t[1:]); b != r.blocks {
		return corruptf("trailer at offset %d: declares %d blocks, file has %d", start, b, r.blocks)
	}
	if s := binary.LittleEndian.Uint64(t[5:]); s != r.series {
		return corruptf("trailer at offset %d: declares %d series, blocks hold %d", start, s, r.series)
	}
	if c := binary.LittleEndian.Uint32(t[13:]); c != r.chain {
		return corruptf("trailer at offset %d: checksum chain mismatch (stored %08x, computed %08x): blocks missing, repeated or reordered", start, c, r.chain)
	}
	var one [1]byte
	n, err := io.ReadFull(r.r, one[:])
	if n > 0 {
		return corruptf("unexpected data after the trailer at offset %d", r.off)
	}
	if err != io.EOF {
		return fmt.Errorf("snapfmt: reading after the trailer: %w", err)
	}
	return io.EOF
}

// readFull reads exactly len(p) bytes; a short read is corruption (truncation).
func (r *Reader) readFull(p []byte, what string) error {
	start := r.off
	n, err := io.ReadFull(r.r, p)
	r.off += int64(n)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return corruptf("%s at offset %d: truncated (%d of %d bytes): %w", what, start, n, len(p), io.ErrUnexpectedEOF)
	}
	if err != nil {
		return fmt.Errorf("snapfmt: reading %s at offset %d: %w", what, start, err)
	}
	return nil
}

// readGrow appends exactly n bytes to dst[:0], growing dst with the data
// actually read rather than trusting n up front.
func (r *Reader) readGrow(dst []byte, n int, what string) ([]byte, error) {
	dst = dst[:0]
	for len(dst) < n {
		step := min(n-len(dst), max(len(dst), readStep))
		dst = slices.Grow(dst, step)
		if err := r.readFull(dst[len(dst):len(dst)+step], what); err != nil {
			return dst, err
		}
		dst = dst[:len(dst)+step]
	}
	return dst, nil
}

// decodePayload decodes a verified block payload p[:plen] (p has padding zero
// bytes after plen) into r.out, returning the series count. Errors are plain
// messages; the caller adds ErrCorrupt and the block position.
func (r *Reader) decodePayload(shard uint32, p []byte, plen int) (uint64, error) {
	d := decoder{p: p, end: plen}
	ntenants := d.uvarint("tenant count")
	total := d.uvarint("series count")
	if d.err != nil {
		return 0, d.err
	}
	if ntenants == 0 || ntenants > uint64(len(r.h.Tenants)) {
		return 0, fmt.Errorf("tenant count %d out of range [1, %d]", ntenants, len(r.h.Tenants))
	}
	// Every series costs at least one bit of payload: bound the allocation.
	if total < ntenants || total > MaxBlockSeries || total > 8*uint64(plen) {
		return 0, fmt.Errorf("series count %d out of range for %d tenants and %d payload bytes", total, ntenants, plen)
	}
	if uint64(cap(r.hashes)) < total {
		r.hashes = make([]uint64, total)
		r.minutes = make([]byte, total)
	}
	hashes := r.hashes[:total]
	minutes := r.minutes[:total]
	out := r.out[:0]
	sb := uint64(shard)
	nextTenant := uint64(0)
	got := uint64(0)
	for i := uint64(0); i < ntenants; i++ {
		delta := d.uvarint("tenant index")
		cnt := d.uvarint("tenant series count")
		lo := d.uvarint("tenant minimum")
		if d.err != nil {
			return 0, fmt.Errorf("tenant entry %d: %w", i, d.err)
		}
		if delta >= uint64(len(r.h.Tenants))-nextTenant {
			return 0, fmt.Errorf("tenant entry %d: tenant index %d+%d out of range or not ascending (%d tenants)", i, nextTenant, delta, len(r.h.Tenants))
		}
		t := nextTenant + delta
		nextTenant = t + 1
		where := func() string { return fmt.Sprintf("tenant %d", t) }
		if cnt == 0 || cnt > total-got {
			return 0, fmt.Errorf("%s: series count %d out of range [1, %d]", where(), cnt, total-got)
		}
		if lo > r.vmax {
			return 0, fmt.Errorf("%s: minimum %#x exceeds %#x", where(), lo, r.vmax)
		}
		hs := hashes[got : got+cnt : got+cnt]
		hs[0] = lo<<r.k | sb
		if cnt >= 2 {
			rng := d.uvarint("tenant range")
			if d.err != nil {
				return 0, fmt.Errorf("%s: %w", where(), d.err)
			}
			if rng < cnt-1 || rng > r.vmax-lo {
				return 0, fmt.Errorf("%s: range %#x out of bounds for %d series from %#x", where(), rng, cnt, lo)
			}
			hs[cnt-1] = (lo+rng)<<r.k | sb
			if cnt >= 3 {
				if err := d.elias(hs[1:cnt-1], lo, rng-1, r.k, sb); err != nil {
					return 0, fmt.Errorf("%s: %w", where(), err)
				}
			}
		}
		out = append(out, TenantSeries{Tenant: uint32(t), Hashes: hs, Minutes: minutes[got : got+cnt : got+cnt]})
		got += cnt
	}
	r.out = out
	if got != total {
		return 0, fmt.Errorf("tenants hold %d series, block declares %d", got, total)
	}
	if err := r.decodeMinutes(&d, minutes); err != nil {
		return 0, err
	}
	if d.pos != d.end {
		return 0, fmt.Errorf("%d unexpected bytes at the end of the payload", d.end-d.pos)
	}
	return total, nil
}

// decoder walks a payload. p extends at least padding bytes beyond end.
type decoder struct {
	p   []byte
	pos int
	end int
	err error
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n, err := wire.Uvarint(d.p[d.pos:d.end])
	if err != nil {
		d.err = fmt.Errorf("bad %s varint at payload offset %d: %w", what, d.pos, err)
		return 0
	}
	d.pos += n
	return v
}

// elias decodes len(dst) values w in [0, u) (Elias-Fano, see format.md) and
// stores ((lo+1+w) << k) | sb in dst. It checks that the values are strictly
// increasing, below u, and that padding bits are zero.
func (d *decoder) elias(dst []uint64, lo, u uint64, k uint, sb uint64) error {
	m := uint64(len(dst))
	l := lowBits(u, m)
	lowLen, highLen, highBits := efSizes(u, m, l)
	if lowLen+highLen > uint64(d.end-d.pos) {
		return fmt.Errorf("Elias-Fano parts need %d bytes, %d left", lowLen+highLen, d.end-d.pos)
	}
	p := d.p
	lowAt := d.pos
	upAt := d.pos + int(lowLen)
	d.pos = upAt + int(highLen)
	if r := (m * uint64(l)) & 7; r != 0 && p[upAt-1]>>r != 0 {
		return errors.New("nonzero padding after the low bits")
	}
	if r := highBits & 7; r != 0 && p[d.pos-1]>>r != 0 {
		return errors.New("nonzero padding after the high bits")
	}
	low := p[lowAt:]
	lmask := uint64(1)<<l - 1
	hmax := (u - 1) >> l
	base := lo + 1
	wide := l > 56
	j := 0
	next := uint64(0)
	for wi := 0; wi < int(highLen); wi += 8 {
		word := binary.LittleEndian.Uint64(p[upAt+wi:])
		if rem := int(highLen) - wi; rem < 8 {
			word &= 1<<(8*rem) - 1
		}
		for word != 0 {
			high := uint64(wi*8+bits.TrailingZeros64(word)) - uint64(j)
			word &= word - 1
			if j == len(dst) {
				return fmt.Errorf("Elias-Fano high bits hold more than %d values", m)
			}
			bp := uint64(j) * uint64(l)
			lv := binary.LittleEndian.Uint64(low[bp>>3:]) >> (bp & 7)
			if wide {
				lv |= uint64(low[bp>>3+8]) << (64 - bp&7)
			}
			wv := high<<l | lv&lmask
			if wv < next || high > hmax {
				return fmt.Errorf("Elias-Fano value %d not ascending or out of range", j)
			}
			next = wv + 1
			dst[j] = (base+wv)<<k | sb
			j++
		}
	}
	if j != len(dst) {
		return fmt.Errorf("Elias-Fano high bits hold %d values, want %d", j, m)
	}
	if next > u {
		return fmt.Errorf("Elias-Fano last value %#x not below %#x", next-1, u)
	}
	return nil
}

// decodeMinutes decodes the minutes section into dst and validates the values.
func (r *Reader) decodeMinutes(d *decoder, dst []byte) error {
	for off := 0; off < len(dst); off += minuteChunk {
		c := dst[off:min(off+minuteChunk, len(dst))]
		if d.pos >= d.end {
			return fmt.Errorf("minutes chunk %d missing", off/minuteChunk)
		}
		mode := d.p[d.pos]
		d.pos++
		switch mode {
		case modeRaw:
			if len(c) > d.end-d.pos {
				return fmt.Errorf("minutes chunk %d truncated", off/minuteChunk)
			}
			d.pos += copy(c, d.p[d.pos:])
		case modeRLE:
			if d.pos >= d.end {
				return fmt.Errorf("minutes chunk %d truncated", off/minuteChunk)
			}
			v := d.p[d.pos]
			d.pos++
			for i := range c {
				c[i] = v
			}
		case modeHuff4X, modeHuff1X:
			clen := d.uvarint("minutes chunk length")
			if d.err != nil {
				return d.err
			}
			if clen > uint64(d.end-d.pos) {
				return fmt.Errorf("minutes chunk %d: length %d exceeds the %d bytes left", off/minuteChunk, clen, d.end-d.pos)
			}
			if err := r.huffDecode(c, d.p[d.pos:d.pos+int(clen)], mode == modeHuff4X); err != nil {
				return fmt.Errorf("minutes chunk %d: %w", off/minuteChunk, err)
			}
			d.pos += int(clen)
		default:
			return fmt.Errorf("minutes chunk %d: unknown mode %d", off/minuteChunk, mode)
		}
	}
	var mx uint8
	for _, v := range dst {
		mx = max(mx, v)
	}
	if mx > MaxMinute {
		i := slices.IndexFunc(dst, func(v uint8) bool { return v > MaxMinute })
		return fmt.Errorf("minute %d of series %d exceeds %d", dst[i], i, MaxMinute)
	}
	return nil
}

// huffDecode decodes one huff0 chunk into c, which it must fill exactly.
func (r *Reader) huffDecode(c, src []byte, x4 bool) (err error) {
	// huff0 is hardened against malformed input, but a panic in a third-party
	// decoder must not take the process down on a crafted snapshot.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("huffman decoder failed: %v", p)
		}
	}()
	s, rest, err := huff0.ReadTable(src, r.huff)
	if err != nil {
		return fmt.Errorf("bad huffman table: %v", err)
	}
	r.huff = s
	var out []byte
	if x4 {
		out, err = s.Decoder().Decompress4X(c[:0:len(c)], rest)
	} else {
		out, err = s.Decoder().Decompress1X(c[:0:len(c)], rest)
	}
	if err != nil {
		return fmt.Errorf("bad huffman data: %v", err)
	}
	if len(out) != len(c) {
		return fmt.Errorf("huffman data holds %d minutes, want %d", len(out), len(c))
	}
	if &out[0] != &c[0] {
		copy(c, out)
	}
	return nil
}
