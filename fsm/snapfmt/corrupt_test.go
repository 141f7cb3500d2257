package snapfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// smallSnapshot has three shard blocks with 1..4 tenants each, small and
// large (Huffman-coded) minutes chunks, a run-length chunk and wide and narrow
// Elias-Fano parts, in about 2 KB.
func smallSnapshot(t testing.TB) []byte {
	r := rand.New(rand.NewPCG(21, 22))
	h := baseHeader(4, 4)
	blocks := []block{
		{2, []TenantSeries{
			randTenant(r, 0, 1, 4, 2, 64, window(r, 0, 120)),
			randTenant(r, 1, 2, 4, 2, 64, window(r, 0, 120)),
			randTenant(r, 3, 5, 4, 2, 64, window(r, 0, 120)),
		}},
		{0, []TenantSeries{
			randTenant(r, 2, 300, 4, 0, 40, window(r, 10, 4)),
			randTenant(r, 3, 80, 4, 0, 64, window(r, 10, 4)),
		}},
		{3, []TenantSeries{randTenant(r, 1, 40, 4, 3, 20, func() uint8 { return 9 })}},
	}
	return encodeBlocks(t, h, blocks)
}

func TestSmallSnapshotShape(t *testing.T) {
	b := smallSnapshot(t)
	t.Logf("small snapshot: %d bytes", len(b))
	if len(b) > 4096 {
		t.Fatalf("small snapshot is %d bytes", len(b))
	}
	if _, _, err := decodeBlocks(b); err != nil {
		t.Fatal(err)
	}
}

func TestFlipEveryBit(t *testing.T) {
	orig := smallSnapshot(t)
	b := bytes.Clone(orig)
	for i := range b {
		for bit := range 8 {
			b[i] ^= 1 << bit
			_, _, err := decodeBlocks(b)
			mustCorrupt(t, err, "flipped bit")
			b[i] ^= 1 << bit
		}
	}
}

func TestFlipEveryBitResealed(t *testing.T) {
	// With checksums recomputed, the field checks behind them must still reject
	// or yield valid content, and never panic.
	orig := smallSnapshot(t)
	accepted := 0
	for i := range orig {
		for bit := range 8 {
			b := bytes.Clone(orig)
			b[i] ^= 1 << bit
			b = reseal(b)
			h, blocks, err := decodeBlocks(b)
			if err != nil {
				mustCorrupt(t, err, "resealed flip")
				continue
			}
			accepted++
			if err := checkDecoded(h, blocks); err != nil {
				t.Fatalf("byte %d bit %d: accepted invalid content: %v", i, bit, err)
			}
		}
	}
	t.Logf("%d of %d resealed single-bit flips decode to other valid content", accepted, 8*len(orig))
}

func TestTruncateEverywhere(t *testing.T) {
	b := smallSnapshot(t)
	for n := range len(b) {
		_, _, err := decodeBlocks(b[:n])
		mustCorrupt(t, err, "truncated")
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("truncated at %d: %v does not wrap io.ErrUnexpectedEOF", n, err)
		}
	}
}

func TestTrailingData(t *testing.T) {
	b := append(smallSnapshot(t), 0)
	_, _, err := decodeBlocks(b)
	mustCorrupt(t, err, "trailing byte")
}

func TestUnknownVersion(t *testing.T) {
	b := smallSnapshot(t)
	binary.LittleEndian.PutUint16(b[6:], Version+1)
	_, err := NewReader(bytes.NewReader(b))
	mustCorrupt(t, err, "future version")
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("%v does not wrap ErrVersion", err)
	}
}

func TestBlockOrderTampering(t *testing.T) {
	b := smallSnapshot(t)
	spans, trailer := blockSpans(t, b)
	head := b[:spans[0][0]]
	blk := func(i int) []byte { return b[spans[i][0]:spans[i][1]] }
	tail := b[trailer:]
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for name, bad := range map[string][]byte{
		"swapped":    cat(head, blk(1), blk(0), blk(2), tail),
		"dropped":    cat(head, blk(0), blk(2), tail),
		"repeated":   cat(head, blk(0), blk(1), blk(1), blk(2), tail),
		"no trailer": cat(head, blk(0), blk(1), blk(2)),
		"two files":  cat(b, b),
	} {
		_, _, err := decodeBlocks(bad)
		mustCorrupt(t, err, name)
		t.Logf("%s: %v", name, err)
	}
	// A repeated block is rejected when it is read, before the trailer, even
	// with a consistent chain and trailer.
	_, got, err := decodeBlocks(reseal(cat(head, blk(0), blk(1), blk(1), blk(2), tail)))
	mustCorrupt(t, err, "repeated, resealed")
	if len(got) != 2 || !strings.Contains(err.Error(), "shard repeated") {
		t.Fatalf("repeated block: %d blocks returned before %v", len(got), err)
	}
}

// sealBlock frames a payload for shard into a complete one-block snapshot.
func sealBlock(h Header, shard uint32, payload []byte) []byte {
	b := appendHeader(nil, &h)
	f := make([]byte, frameLen)
	f[0] = kindShard
	binary.LittleEndian.PutUint32(f[1:], shard)
	binary.LittleEndian.PutUint32(f[5:], uint32(len(payload)))
	b = append(append(b, f...), payload...)
	return withTrailer(b)
}

func withTrailer(b []byte) []byte {
	b = append(b, kindEnd)
	return reseal(append(b, make([]byte, trailerLen-1)...))
}

func TestCraftedFields(t *testing.T) {
	h := baseHeader(4, 2)
	uv := func(vals ...uint64) []byte {
		var b []byte
		for _, v := range vals {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	// Valid reference: tenant 0, three hashes v = 10, 11, 13 (one inner value,
	// w = 0 of u = 2: L = 1, one low byte, one high byte), minutes raw.
	valid := cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeRaw, 1, 2, 3})
	if _, blocks, err := decodeBlocks(sealBlock(h, 1, valid)); err != nil || len(blocks) != 1 ||
		blocks[0].series[0].Hashes[1] != 11<<2|1 {
		t.Fatalf("reference payload: %v %+v", err, blocks)
	}
	cases := map[string][]byte{
		"no tenants":             cat(uv(0, 0), []byte{modeRaw}),
		"too many tenants":       cat(uv(3, 3, 0, 1, 10, 0, 1, 11, 0, 1, 12), []byte{modeRaw, 1, 2, 3}),
		"absurd series":          cat(uv(1, 1<<40, 0, 1<<40, 10), []byte{modeRaw, 1}),
		"series below tenants":   cat(uv(2, 1, 0, 1, 10, 0, 1, 11), []byte{modeRaw, 1}),
		"tenant out of range":    cat(uv(1, 1, 2, 1, 10), []byte{modeRaw, 1}),
		"tenants not ascending":  cat(uv(2, 2, 1, 1, 10, 0, 1, 11), []byte{modeRaw, 1, 2}),
		"zero count":             cat(uv(1, 1, 0, 0, 10), []byte{modeRaw, 1}),
		"count above total":      cat(uv(1, 1, 0, 2, 10, 1), []byte{modeRaw, 1, 2}),
		"total above counts":     cat(uv(1, 2, 0, 1, 10), []byte{modeRaw, 1, 2}),
		"min beyond shard space": cat(uv(1, 1, 0, 1, 1<<62), []byte{modeRaw, 1}),
		"range overflows":        cat(uv(1, 2, 0, 2, 1<<62-2, 5), []byte{modeRaw, 1, 2}),
		"range too small":        cat(uv(1, 3, 0, 3, 10, 1), []byte{0, 0b1, modeRaw, 1, 2, 3}),
		"EF truncated":           cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0}),
		"EF no value":            cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b0}, []byte{modeRaw, 1, 2, 3}),
		// u = 64, m = 2: L = 5, two low bytes, three high bits.
		"EF extra value":     cat(uv(1, 4, 0, 4, 10, 65), []byte{0b100000, 0, 0b111}, []byte{modeRaw, 1, 2, 3, 4}),
		"EF equal values":    cat(uv(1, 4, 0, 4, 10, 65), []byte{0, 0, 0b011}, []byte{modeRaw, 1, 2, 3, 4}),
		"EF decreasing":      cat(uv(1, 4, 0, 4, 10, 65), []byte{0b1, 0, 0b011}, []byte{modeRaw, 1, 2, 3, 4}),
		"EF high too big":    cat(uv(1, 4, 0, 4, 10, 65), []byte{0, 0, 0b100}, []byte{modeRaw, 1, 2, 3, 4}),
		"EF value too big":   cat(uv(1, 3, 0, 3, 10, 4), []byte{0b1, 0b10}, []byte{modeRaw, 1, 2, 3}),
		"EF valid (control)": nil,
		"EF low padding":     cat(uv(1, 3, 0, 3, 10, 3), []byte{0b10, 0b1}, []byte{modeRaw, 1, 2, 3}),
		"EF high padding":    cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b101}, []byte{modeRaw, 1, 2, 3}),
		"minute 120":         cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeRaw, 1, 120, 3}),
		"minute run 200":     cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeRLE, 200}),
		"minutes missing":    cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}),
		"minutes short":      cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeRaw, 1, 2}),
		"minutes mode":       cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{9, 1, 2, 3}),
		"huffman garbage":    cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeHuff1X, 4, 0xff, 0xff, 0xff, 0xff}),
		"huffman 4X garbage": cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeHuff4X, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}),
		"huffman length":     cat(uv(1, 3, 0, 3, 10, 3), []byte{0b0, 0b1}, []byte{modeHuff4X, 100, 1}),
		"trailing payload":   cat(valid, []byte{0}),
	}
	// Controls: the EF cases above differ from these valid payloads in one place.
	for _, p := range [][]byte{
		cat(uv(1, 4, 0, 4, 10, 65), []byte{0b1, 0, 0b101}, []byte{modeRaw, 1, 2, 3, 4}),
		cat(uv(1, 3, 0, 3, 10, 4), []byte{0b0, 0b10}, []byte{modeRaw, 1, 2, 3}),
	} {
		if _, _, err := decodeBlocks(sealBlock(h, 1, p)); err != nil {
			t.Fatalf("control payload: %v", err)
		}
	}
	delete(cases, "EF valid (control)")
	for name, p := range cases {
		_, _, err := decodeBlocks(sealBlock(h, 1, p))
		mustCorrupt(t, err, name)
		t.Logf("%s: %v", name, err)
	}
	// Framing.
	for name, b := range map[string][]byte{
		"shard out of range": sealBlock(h, 4, valid),
		"empty payload":      sealBlock(h, 1, nil),
		"unknown kind":       withTrailer(append(appendHeader(nil, &h), 'X')),
		"bad magic":          append([]byte("TGSNAQ"), appendHeader(nil, &h)[6:]...),
	} {
		_, _, err := decodeBlocks(b)
		mustCorrupt(t, err, name)
		t.Logf("%s: %v", name, err)
	}
}

func TestCraftedHeader(t *testing.T) {
	h := baseHeader(4, 2)
	body := func(mod func(b []byte) []byte) []byte {
		b := appendHeader(nil, &h)
		b = mod(b[:len(b)-4])
		binary.LittleEndian.PutUint32(b[8:], uint32(len(b)-headerFixed))
		return withTrailer(binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)))
	}
	for name, b := range map[string][]byte{
		"shards 3":        body(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 3); return b }),
		"group empty":     body(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 40); return b }),
		"short body":      body(func(b []byte) []byte { return b[:headerFixed+20] }),
		"trailing body":   body(func(b []byte) []byte { return append(b, 0) }),
		"tenant twice":    body(func(b []byte) []byte { return append(b[:len(b)-2], 't', '0') }),
		"tenants missing": body(func(b []byte) []byte { return b[:len(b)-3] }),
	} {
		_, _, err := decodeBlocks(b)
		mustCorrupt(t, err, name)
		t.Logf("%s: %v", name, err)
	}
}

// TestBoundedAllocation: lengths that claim far more than the input holds must
// fail without allocating what they claim.
func TestBoundedAllocation(t *testing.T) {
	h := baseHeader(4, 2)
	hdr := appendHeader(nil, &h)
	bigHeader := bytes.Clone(hdr[:headerFixed])
	binary.LittleEndian.PutUint32(bigHeader[8:], MaxHeaderBody)
	bigBlock := append(bytes.Clone(hdr), kindShard, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 1, 2, 3)
	absurd := sealBlock(h, 1, append(binary.AppendUvarint([]byte{1}, 1<<40), 0, 0, 0, 0))
	for name, b := range map[string][]byte{
		"header 64 MiB":  append(bigHeader, 1, 2, 3),
		"payload 2 GiB":  bigBlock,
		"2^40 series":    absurd,
		"header > limit": func() []byte { x := bytes.Clone(bigHeader); x[11] = 0x7f; return x }(),
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _, err := decodeBlocks(b)
		runtime.ReadMemStats(&after)
		mustCorrupt(t, err, name)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
			t.Errorf("%s: allocated %d bytes", name, alloc)
		}
		t.Logf("%s: %v", name, err)
	}
}

type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, e.err
	}
	return n, err
}

func TestReadError(t *testing.T) {
	b := smallSnapshot(t)
	boom := errors.New("boom")
	for _, n := range []int{5, 40, len(b) / 2, len(b) - 3} {
		rd, err := NewReader(&errReader{bytes.NewReader(b[:n]), boom})
		for err == nil {
			_, _, err = rd.Next()
		}
		if !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut at %d: %v", n, err)
		}
	}
	// Errors are sticky.
	rd, _ := NewReader(bytes.NewReader(b[:len(b)-1]))
	var err error
	for err == nil {
		_, _, err = rd.Next()
	}
	if _, _, err2 := rd.Next(); err2 != err {
		t.Fatalf("not sticky: %v then %v", err, err2)
	}
}

func TestCorruptHuffman4X(t *testing.T) {
	// A block with > 4096 minutes stores them as huff0 4X streams; damage them
	// behind recomputed checksums.
	r := rand.New(rand.NewPCG(41, 42))
	h := baseHeader(2, 1)
	orig := encodeBlocks(t, h, []block{{1, []TenantSeries{randTenant(r, 0, 6000, 2, 1, 62, window(r, 0, 20))}}})
	spans, _ := blockSpans(t, orig)
	end := spans[0][1]
	// The minutes section is the last ~0.55 byte per series of the payload.
	start := end - 3400
	for i := range 3000 {
		b := bytes.Clone(orig)
		for range 1 + i%3 {
			b[start+r.IntN(end-start)] ^= byte(1 + r.IntN(255))
		}
		hd, blocks, err := decodeBlocks(reseal(b))
		if err != nil {
			mustCorrupt(t, err, "damaged huffman")
			continue
		}
		if err := checkDecoded(hd, blocks); err != nil {
			t.Fatal(err)
		}
	}
}
