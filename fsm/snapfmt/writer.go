package snapfmt

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"slices"

	"github.com/klauspost/compress/huff0"
)

// Tuning of the encoder's sort (not part of the format).
const (
	// genericBelow: tenants with fewer series are sorted with a comparison sort.
	genericBelow = 64
	// bucketExtra: the counting sort uses buckets 2^bucketExtra times wider than
	// the Elias-Fano high buckets, so the bucket counters stay cache-resident.
	bucketExtra = 2
	// insertionMax: larger buckets (adversarial input) use slices.Sort.
	insertionMax = 24
)

// Writer encodes a snapshot. It is not safe for concurrent use.
//
// WriteShard never modifies the caller's slices and keeps no reference to them
// after it returns: the series are sorted in the Writer's own scratch buffers,
// which are reused from block to block.
type Writer struct {
	w        io.Writer
	shards   uint32
	tenants  uint32
	k        uint // log2(shards)
	seen     []bool
	blocks   uint32
	series   uint64
	chain    uint32
	err      error // sticky: the underlying writer failed
	closed   bool
	closeErr error
	version  uint16
	lastSect string // name of the last section written ("" before the first)
	sections uint32

	buf    []byte   // frame + payload of the block being built
	mins   []byte   // minutes of the block, in output order
	order  []int32  // indexes of the non-empty series, by tenant
	counts []uint32 // counting-sort buckets
	packed []uint64 // (w mod 2^shift) << 8 | minute, bucket-sorted
	pairs  []pair   // comparison-sort path
	huff   huff0.Scratch

	forceGeneric bool // tests: always use the comparison-sort path
}

type pair struct {
	v uint64
	m uint8
}

// NewWriter validates h and writes the snapshot header to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if msg := checkHeader(&h); msg != "" {
		return nil, invalidf("header: %s", msg)
	}
	hb := appendHeader(nil, &h)
	if body := len(hb) - headerFixed - 4; body > MaxHeaderBody {
		return nil, invalidf("header: encoded body is %d bytes, at most %d allowed", body, MaxHeaderBody)
	}
	if _, err := w.Write(hb); err != nil {
		return nil, fmt.Errorf("snapfmt: writing header: %w", err)
	}
	return &Writer{
		w:       w,
		shards:  h.Shards,
		tenants: uint32(len(h.Tenants)),
		k:       uint(bits.TrailingZeros32(h.Shards)),
		seen:    make([]bool, h.Shards),
		chain:   crc32.Update(0, castagnoli, hb[len(hb)-4:]),
		version: max(h.Version, 1),
	}, nil
}

// WriteShard writes the block of one shard. Call it at most once per shard, in
// any shard order; shards without series may be skipped. Entries with no hashes
// are ignored (a shard whose entries are all empty writes no block). Every hash
// must satisfy hash&(Shards-1) == shard, hashes must be distinct within one
// TenantSeries, minutes must be ≤ MaxMinute, and a tenant may appear only once
// per shard; violations return an error wrapping ErrInvalid and write nothing.
//
// The bytes written depend only on the shard number and on the set of (tenant,
// hash, minute) triples, not on the order of series or of hashes.
func (w *Writer) WriteShard(shard uint32, series []TenantSeries) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return invalidf("WriteShard after Close")
	}
	if w.lastSect != "" {
		return invalidf("WriteShard after WriteSection: sections follow every shard block")
	}
	if shard >= w.shards {
		return invalidf("shard %d out of range [0, %d)", shard, w.shards)
	}
	if w.seen[shard] {
		return invalidf("shard %d written twice", shard)
	}
	order := w.order[:0]
	total := uint64(0)
	for i := range series {
		ts := &series[i]
		if len(ts.Hashes) != len(ts.Minutes) {
			return invalidf("shard %d tenant %d: %d hashes but %d minutes", shard, ts.Tenant, len(ts.Hashes), len(ts.Minutes))
		}
		if ts.Tenant >= w.tenants {
			return invalidf("shard %d: tenant index %d out of range (header has %d tenants)", shard, ts.Tenant, w.tenants)
		}
		order = append(order, int32(i))
		total += uint64(len(ts.Hashes))
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(series[a].Tenant, series[b].Tenant) })
	for i := 1; i < len(order); i++ {
		if t := series[order[i]].Tenant; t == series[order[i-1]].Tenant {
			w.order = order
			return invalidf("shard %d: tenant %d listed twice", shard, t)
		}
	}
	order = slices.DeleteFunc(order, func(i int32) bool { return len(series[i].Hashes) == 0 })
	w.order = order
	if len(order) == 0 {
		w.seen[shard] = true
		return nil
	}
	if total > MaxBlockSeries {
		return invalidf("shard %d: %d series, at most %d per block", shard, total, MaxBlockSeries)
	}

	b := append(w.buf[:0], make([]byte, frameLen)...)
	b = binary.AppendUvarint(b, uint64(len(order)))
	b = binary.AppendUvarint(b, total)
	w.mins = slices.Grow(w.mins[:0], int(total))
	next := uint32(0)
	for _, i := range order {
		ts := &series[i]
		b = binary.AppendUvarint(b, uint64(ts.Tenant-next))
		next = ts.Tenant + 1
		var err error
		if b, err = w.appendTenant(b, shard, ts); err != nil {
			w.buf = b[:0]
			return fmt.Errorf("shard %d tenant %d: %w", shard, ts.Tenant, err)
		}
	}
	b = w.appendMinutes(b)
	w.buf = b
	payload := len(b) - frameLen
	if payload > MaxPayload {
		return invalidf("shard %d: block payload is %d bytes, at most %d allowed", shard, payload, MaxPayload)
	}
	b[0] = kindShard
	binary.LittleEndian.PutUint32(b[1:], shard)
	binary.LittleEndian.PutUint32(b[5:], uint32(payload))
	crc := crc32.Update(crc32.Checksum(b[:9], castagnoli), castagnoli, b[frameLen:])
	binary.LittleEndian.PutUint32(b[9:], crc)
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("snapfmt: writing block of shard %d: %w", shard, err)
		return w.err
	}
	w.seen[shard] = true
	w.blocks++
	w.series += total
	w.chain = crc32.Update(w.chain, castagnoli, b[9:13])
	return nil
}

// WriteSection writes a section block (format version 2 only): a named opaque
// payload, checksummed like a shard block. Sections follow every shard block
// and come in strictly ascending name order, so the bytes of a file are a
// function of its content. Invalid input returns ErrInvalid and writes nothing.
func (w *Writer) WriteSection(name string, payload []byte) error {
	if w.err != nil {
		return w.err
	}
	switch {
	case w.closed:
		return invalidf("WriteSection after Close")
	case w.version < 2:
		return invalidf("section %q: a version %d file cannot hold sections (set Header.Version to 2)", name, w.version)
	case len(payload) > MaxPayload:
		return invalidf("section %q: payload is %d bytes, at most %d allowed", name, len(payload), MaxPayload)
	case w.lastSect != "" && name <= w.lastSect:
		return invalidf("section %q after %q: names must be distinct and ascending", name, w.lastSect)
	case w.sections >= MaxSections:
		return invalidf("section %q: more than %d sections", name, MaxSections)
	}
	if msg := checkSectionName(name); msg != "" {
		return invalidf("%s", msg)
	}
	b := append(w.buf[:0], kindSection, byte(len(name)))
	b = append(b, name...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	crc := crc32.Update(crc32.Checksum(b, castagnoli), castagnoli, payload)
	b = binary.LittleEndian.AppendUint32(b, crc)
	w.buf = b[:0]
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("snapfmt: writing section %q: %w", name, err)
		return w.err
	}
	if _, err := w.w.Write(payload); err != nil {
		w.err = fmt.Errorf("snapfmt: writing section %q: %w", name, err)
		return w.err
	}
	w.lastSect = name
	w.sections++
	w.blocks++
	w.chain = crc32.Update(w.chain, castagnoli, b[len(b)-4:])
	return nil
}

// Close writes the trailer (block count, series count, checksum chain). It does
// not close the underlying writer. Calling Close again returns the first result.
func (w *Writer) Close() error {
	if w.closed {
		return w.closeErr
	}
	w.closed = true
	if w.err != nil {
		w.closeErr = w.err
		return w.err
	}
	var t [trailerLen]byte
	t[0] = kindEnd
	binary.LittleEndian.PutUint32(t[1:], w.blocks)
	binary.LittleEndian.PutUint64(t[5:], w.series)
	binary.LittleEndian.PutUint32(t[13:], w.chain)
	binary.LittleEndian.PutUint32(t[17:], crc32.Checksum(t[:17], castagnoli))
	if _, err := w.w.Write(t[:]); err != nil {
		w.closeErr = fmt.Errorf("snapfmt: writing trailer: %w", err)
		w.err = w.closeErr
	}
	return w.closeErr
}

// appendTenant appends the entry of one tenant (after its tenant delta): count,
// min, range and the Elias-Fano parts, and appends its minutes to w.mins.
func (w *Writer) appendTenant(b []byte, shard uint32, ts *TenantSeries) ([]byte, error) {
	hs := ts.Hashes
	ms := ts.Minutes[:len(hs)]
	n := len(hs)
	k := w.k
	mask := uint64(w.shards - 1)
	sb := uint64(shard)

	lo, hi := ^uint64(0), uint64(0)
	var bad uint64
	var maxMin uint8
	for i, h := range hs {
		bad |= h&mask ^ sb
		v := h >> k
		lo = min(lo, v)
		hi = max(hi, v)
		maxMin = max(maxMin, ms[i])
	}
	if bad != 0 {
		for _, h := range hs {
			if h&mask != sb {
				return b, invalidf("hash %#016x belongs to shard %d", h, h&mask)
			}
		}
	}
	if maxMin > MaxMinute {
		for i, m := range ms {
			if m > MaxMinute {
				return b, invalidf("hash %#016x has minute %d, at most %d allowed", hs[i], m, MaxMinute)
			}
		}
	}

	b = binary.AppendUvarint(b, uint64(n))
	b = binary.AppendUvarint(b, lo)
	if n == 1 {
		w.mins = append(w.mins, ms[0])
		return b, nil
	}
	r := hi - lo
	if r < uint64(n-1) {
		return b, errDuplicate(hs)
	}
	b = binary.AppendUvarint(b, r)
	if n == 2 {
		if hs[0]>>k == lo {
			w.mins = append(w.mins, ms[0], ms[1])
		} else {
			w.mins = append(w.mins, ms[1], ms[0])
		}
		return b, nil
	}

	m := uint64(n - 2)
	u := r - 1
	l := lowBits(u, m)
	lowLen, highLen, _ := efSizes(u, m, l)
	start := len(b)
	b = slices.Grow(b, int(lowLen+highLen))[:start+int(lowLen+highLen)]
	low := b[start : start+int(lowLen)]
	up := b[start+int(lowLen):]
	clear(up)

	shift := l + bucketExtra
	if w.forceGeneric || n < genericBelow || shift > 56 {
		return b, w.efGeneric(low, up, hs, ms, lo, l)
	}
	return b, w.efBucket(low, up, hs, ms, lo, u, l, shift)
}

func errDuplicate(hs []uint64) error {
	s := slices.Clone(hs)
	slices.Sort(s)
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return invalidf("duplicate hash %#016x", s[i])
		}
	}
	return invalidf("duplicate hashes")
}

// efBucket sorts the inner values w = v-lo-1 (v = hash>>k, lo < v < lo+u+1) with
// a counting sort by w>>shift followed by an insertion sort of each bucket, and
// writes the Elias-Fano low bits to low, the high bits to up (zeroed) and the
// minutes to w.mins.
func (w *Writer) efBucket(low, up []byte, hs []uint64, ms []uint8, lo, u uint64, l, shift uint) error {
	k := w.k
	m := len(hs) - 2
	nb := int((u-1)>>shift) + 1
	if cap(w.counts) < nb {
		w.counts = make([]uint32, nb)
	}
	counts := w.counts[:nb]
	clear(counts)
	for _, h := range hs {
		wv := h>>k - lo - 1
		if wv >= u { // v == lo wraps around; v == hi gives u
			continue
		}
		counts[wv>>shift]++
	}
	sum := uint32(0)
	for i, c := range counts {
		counts[i] = sum
		sum += c
	}
	if int(sum) != m {
		return errDuplicate(hs)
	}
	if cap(w.packed) < m {
		w.packed = make([]uint64, m)
	}
	packed := w.packed[:m]
	smask := uint64(1)<<shift - 1
	var loMin, hiMin uint8
	for i, h := range hs {
		wv := h>>k - lo - 1
		if wv >= u {
			if wv == u {
				hiMin = ms[i]
			} else {
				loMin = ms[i]
			}
			continue
		}
		bk := wv >> shift
		packed[counts[bk]] = (wv&smask)<<8 | uint64(ms[i])
		counts[bk]++
	}

	mins := append(w.mins, loMin)
	lmask := uint64(1)<<l - 1
	var acc uint64
	var nacc uint
	lp := 0
	j := uint64(0)
	next := uint64(0)
	begin := uint32(0)
	for bk, end := range counts {
		if begin == end {
			continue
		}
		bucket := packed[begin:end]
		begin = end
		if len(bucket) > 1 {
			sortBucket(bucket)
		}
		base := uint64(bk) << shift
		for _, p := range bucket {
			wv := base | p>>8
			if wv < next {
				return errDuplicate(hs)
			}
			next = wv + 1
			pos := wv>>l + j
			j++
			up[pos>>3] |= 1 << (pos & 7)
			lv := wv & lmask
			acc |= lv << nacc
			nacc += l
			if nacc >= 64 {
				binary.LittleEndian.PutUint64(low[lp:], acc)
				lp += 8
				nacc -= 64
				acc = lv >> (l - nacc)
			}
			mins = append(mins, uint8(p))
		}
	}
	for ; nacc > 0; nacc -= min(nacc, 8) {
		low[lp] = byte(acc)
		acc >>= 8
		lp++
	}
	w.mins = append(mins, hiMin)
	return nil
}

func sortBucket(s []uint64) {
	if len(s) > insertionMax {
		slices.Sort(s)
		return
	}
	for i := 1; i < len(s); i++ {
		x := s[i]
		j := i
		for ; j > 0 && s[j-1] > x; j-- {
			s[j] = s[j-1]
		}
		s[j] = x
	}
}

// efGeneric is efBucket with a comparison sort; it handles any low-bit width.
func (w *Writer) efGeneric(low, up []byte, hs []uint64, ms []uint8, lo uint64, l uint) error {
	k := w.k
	pairs := w.pairs[:0]
	for i, h := range hs {
		pairs = append(pairs, pair{h >> k, ms[i]})
	}
	w.pairs = pairs
	slices.SortFunc(pairs, func(a, b pair) int { return cmp.Compare(a.v, b.v) })
	for i := 1; i < len(pairs); i++ {
		if pairs[i].v == pairs[i-1].v {
			return errDuplicate(hs)
		}
	}
	inner := pairs[1 : len(pairs)-1]
	lmask := uint64(1)<<l - 1
	var acc uint64
	var nacc uint
	lp := 0
	mins := append(w.mins, pairs[0].m)
	for j, p := range inner {
		wv := p.v - lo - 1
		pos := wv>>l + uint64(j)
		up[pos>>3] |= 1 << (pos & 7)
		lv := wv & lmask
		acc |= lv << nacc
		nacc += l
		if nacc >= 64 {
			binary.LittleEndian.PutUint64(low[lp:], acc)
			lp += 8
			nacc -= 64
			acc = lv >> (l - nacc)
		}
		mins = append(mins, p.m)
	}
	for ; nacc > 0; nacc -= min(nacc, 8) {
		low[lp] = byte(acc)
		acc >>= 8
		lp++
	}
	w.mins = append(mins, pairs[len(pairs)-1].m)
	return nil
}

// appendMinutes appends the minutes section: the block's minutes in chunks of
// minuteChunk, each stored raw, as a run, or Huffman-coded (huff0).
func (w *Writer) appendMinutes(b []byte) []byte {
	mins := w.mins
	for len(mins) > 0 {
		c := mins[:min(len(mins), minuteChunk)]
		mins = mins[len(c):]
		b = w.appendChunk(b, c)
	}
	return b
}

func (w *Writer) appendChunk(b []byte, c []byte) []byte {
	if allSame(c) {
		return append(b, modeRLE, c[0])
	}
	if len(c) >= 32 {
		// Reset the knobs huff0 keeps in its scratch so every chunk is coded
		// independently of the previous ones (determinism).
		s := &w.huff
		s.Reuse = huff0.ReusePolicyNone
		s.TableLog = 0
		s.MaxSymbolValue = 0
		s.WantLogLess = 0
		mode := byte(modeHuff4X)
		var out []byte
		var err error
		if len(c) < 4096 {
			mode = modeHuff1X
			out, _, err = huff0.Compress1X(c, s)
		} else {
			out, _, err = huff0.Compress4X(c, s)
		}
		// Any error (typically huff0.ErrIncompressible) falls back to raw.
		if err == nil && len(out) < len(c) {
			b = append(b, mode)
			b = binary.AppendUvarint(b, uint64(len(out)))
			return append(b, out...)
		}
	}
	b = append(b, modeRaw)
	return append(b, c...)
}

func allSame(c []byte) bool {
	for _, x := range c[1:] {
		if x != c[0] {
			return false
		}
	}
	return true
}
