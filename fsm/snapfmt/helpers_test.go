package snapfmt

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
)

type block struct {
	shard  uint32
	series []TenantSeries
}

// canon returns what a reader must return for a block written from series:
// non-empty entries, ascending tenants, ascending hashes with their minutes.
func canon(series []TenantSeries) []TenantSeries {
	var out []TenantSeries
	for _, ts := range series {
		if len(ts.Hashes) == 0 {
			continue
		}
		idx := make([]int, len(ts.Hashes))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(ts.Hashes[a], ts.Hashes[b]) })
		c := TenantSeries{Tenant: ts.Tenant, Hashes: make([]uint64, len(idx)), Minutes: make([]uint8, len(idx))}
		for i, j := range idx {
			c.Hashes[i], c.Minutes[i] = ts.Hashes[j], ts.Minutes[j]
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b TenantSeries) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return out
}

func cloneSeries(series []TenantSeries) []TenantSeries {
	out := make([]TenantSeries, len(series))
	for i, ts := range series {
		out[i] = TenantSeries{Tenant: ts.Tenant, Hashes: slices.Clone(ts.Hashes), Minutes: slices.Clone(ts.Minutes)}
	}
	return out
}

func encodeBlocks(t testing.TB, h Header, blocks []block, opts ...func(*Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(w)
	}
	for _, b := range blocks {
		if err := w.WriteShard(b.shard, b.series); err != nil {
			t.Fatalf("WriteShard(%d): %v", b.shard, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func generic(w *Writer) { w.forceGeneric = true }

// decodeBlocks decodes a whole snapshot, copying everything the reader returns.
func decodeBlocks(b []byte) (Header, []block, error) {
	rd, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return Header{}, nil, err
	}
	var out []block
	for {
		s, series, err := rd.Next()
		if err == io.EOF {
			return rd.Header(), out, nil
		}
		if err != nil {
			return rd.Header(), out, err
		}
		out = append(out, block{s, cloneSeries(series)})
	}
}

func equalSeries(a, b []TenantSeries) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d tenant entries, want %d", len(a), len(b))
	}
	for i := range a {
		if a[i].Tenant != b[i].Tenant {
			return fmt.Errorf("entry %d: tenant %d, want %d", i, a[i].Tenant, b[i].Tenant)
		}
		if !slices.Equal(a[i].Hashes, b[i].Hashes) {
			return fmt.Errorf("tenant %d: hashes differ (%d vs %d)", a[i].Tenant, len(a[i].Hashes), len(b[i].Hashes))
		}
		if !bytes.Equal(a[i].Minutes, b[i].Minutes) {
			return fmt.Errorf("tenant %d: minutes differ", a[i].Tenant)
		}
	}
	return nil
}

func checkRoundTrip(t *testing.T, h Header, blocks []block) []byte {
	t.Helper()
	b := encodeBlocks(t, h, blocks)
	if g := encodeBlocks(t, h, blocks, generic); !bytes.Equal(b, g) {
		t.Fatalf("bucket-sort and comparison-sort encodings differ (%d vs %d bytes)", len(b), len(g))
	}
	gh, got, err := decodeBlocks(b)
	if err != nil {
		t.Fatal(err)
	}
	if gh.Partitions != h.Partitions || gh.Shards != h.Shards || gh.GroupLo != h.GroupLo || gh.GroupHi != h.GroupHi ||
		gh.Index != h.Index || gh.Term != h.Term || !bytes.Equal(gh.Meta, h.Meta) || !slices.Equal(gh.Tenants, h.Tenants) {
		t.Fatalf("header %+v, want %+v", gh, h)
	}
	var want []block
	for _, bl := range blocks {
		if c := canon(bl.series); len(c) > 0 {
			want = append(want, block{bl.shard, c})
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d blocks, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].shard != want[i].shard {
			t.Fatalf("block %d: shard %d, want %d", i, got[i].shard, want[i].shard)
		}
		if err := equalSeries(got[i].series, want[i].series); err != nil {
			t.Fatalf("block %d (shard %d): %v", i, got[i].shard, err)
		}
	}
	return b
}

// randTenant returns n distinct random hashes of the given shard (below 2^bitsTop)
// with minutes drawn by minute.
func randTenant(r *rand.Rand, tenant uint32, n int, shards uint32, shard uint32, bitsTop uint, minute func() uint8) TenantSeries {
	ts := TenantSeries{Tenant: tenant}
	seen := make(map[uint64]bool, n)
	mask := uint64(shards - 1)
	for len(ts.Hashes) < n {
		h := r.Uint64()
		if bitsTop < 64 {
			h &= 1<<bitsTop - 1
		}
		h = h&^mask | uint64(shard)
		if seen[h] {
			continue
		}
		seen[h] = true
		ts.Hashes = append(ts.Hashes, h)
		ts.Minutes = append(ts.Minutes, minute())
	}
	return ts
}

func tenantNames(n int) []string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("t%d", i))
	}
	return s
}

// reseal recomputes every checksum, the checksum chain and the trailer totals
// of a snapshot whose framing is intact, so tests can reach the field checks
// behind the checksums. Malformed framing is left as is.
func reseal(in []byte) []byte {
	b := slices.Clone(in)
	if len(b) < headerFixed {
		return b
	}
	hend := headerFixed + int(binary.LittleEndian.Uint32(b[8:]))
	if hend < 0 || hend+4 > len(b) {
		return b
	}
	binary.LittleEndian.PutUint32(b[hend:], crc32.Checksum(b[:hend], castagnoli))
	chain := crc32.Update(0, castagnoli, b[hend:hend+4])
	pos := hend + 4
	blocks, series := uint32(0), uint64(0)
	for pos < len(b) {
		switch b[pos] {
		case kindShard:
			if pos+frameLen > len(b) {
				return b
			}
			plen := int(binary.LittleEndian.Uint32(b[pos+5:]))
			if plen < 0 || pos+frameLen+plen > len(b) {
				return b
			}
			p := b[pos+frameLen : pos+frameLen+plen]
			crc := crc32.Update(crc32.Checksum(b[pos:pos+9], castagnoli), castagnoli, p)
			binary.LittleEndian.PutUint32(b[pos+9:], crc)
			chain = crc32.Update(chain, castagnoli, b[pos+9:pos+13])
			blocks++
			if _, n := binary.Uvarint(p); n > 0 {
				t, _ := binary.Uvarint(p[n:])
				series += t
			}
			pos += frameLen + plen
		case kindEnd:
			if pos+trailerLen > len(b) {
				return b
			}
			t := b[pos:]
			binary.LittleEndian.PutUint32(t[1:], blocks)
			binary.LittleEndian.PutUint64(t[5:], series)
			binary.LittleEndian.PutUint32(t[13:], chain)
			binary.LittleEndian.PutUint32(t[17:], crc32.Checksum(t[:17], castagnoli))
			return b
		default:
			return b
		}
	}
	return b
}

// blockSpans returns [start, end) of each shard block of a valid snapshot and
// the start of the trailer.
func blockSpans(t testing.TB, b []byte) (spans [][2]int, trailer int) {
	t.Helper()
	pos := headerFixed + int(binary.LittleEndian.Uint32(b[8:])) + 4
	for b[pos] == kindShard {
		end := pos + frameLen + int(binary.LittleEndian.Uint32(b[pos+5:]))
		spans = append(spans, [2]int{pos, end})
		pos = end
	}
	if b[pos] != kindEnd || pos+trailerLen != len(b) {
		t.Fatalf("bad framing at %d", pos)
	}
	return spans, pos
}

// checkDecoded verifies the invariants of anything a Reader accepted.
func checkDecoded(h Header, blocks []block) error {
	mask := uint64(h.Shards - 1)
	for _, bl := range blocks {
		prevTenant := -1
		for _, ts := range bl.series {
			if int(ts.Tenant) <= prevTenant || int(ts.Tenant) >= len(h.Tenants) {
				return fmt.Errorf("shard %d: tenant %d out of order or range", bl.shard, ts.Tenant)
			}
			prevTenant = int(ts.Tenant)
			if len(ts.Hashes) == 0 || len(ts.Hashes) != len(ts.Minutes) {
				return fmt.Errorf("shard %d tenant %d: %d hashes, %d minutes", bl.shard, ts.Tenant, len(ts.Hashes), len(ts.Minutes))
			}
			for i, x := range ts.Hashes {
				if x&mask != uint64(bl.shard) {
					return fmt.Errorf("hash %#x not in shard %d", x, bl.shard)
				}
				if i > 0 && x <= ts.Hashes[i-1] {
					return fmt.Errorf("hashes not strictly ascending")
				}
				if ts.Minutes[i] > MaxMinute {
					return fmt.Errorf("minute %d", ts.Minutes[i])
				}
			}
		}
	}
	return nil
}

func mustCorrupt(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("%s: error does not wrap ErrCorrupt: %v", what, err)
	}
}
