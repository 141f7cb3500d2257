package snapfmt

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func window(r *rand.Rand, start, width int) func() uint8 {
	return func() uint8 { return uint8((start + r.IntN(width)) % 120) }
}

func baseHeader(shards uint32, tenants int) Header {
	return Header{Partitions: 64, Shards: shards, GroupLo: 16, GroupHi: 32, Index: 99, Term: 3,
		Meta: []byte{1, 2, 3}, Tenants: tenantNames(tenants)}
}

func TestRoundTripSizes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 4, 5, 63, 64, 65, 100, 1000, 100_000, 300_000} {
		h := baseHeader(16, 1)
		ts := randTenant(r, 0, n, 16, 5, 62, window(r, 100, 20))
		b := checkRoundTrip(t, h, []block{{5, []TenantSeries{ts}}})
		if n >= 1000 {
			t.Logf("n=%d: %.3f bytes/series", n, float64(len(b))/float64(n))
		}
	}
}

func TestRoundTripEmpty(t *testing.T) {
	// No tenants, no blocks.
	h := Header{Partitions: 1, Shards: 1, GroupLo: 0, GroupHi: 1}
	b := checkRoundTrip(t, h, nil)
	// Empty entries and an all-empty shard write nothing.
	h = baseHeader(4, 3)
	b2 := checkRoundTrip(t, h, []block{
		{0, nil},
		{1, []TenantSeries{{Tenant: 2}, {Tenant: 0, Hashes: []uint64{1}, Minutes: []uint8{7}}}},
		{2, []TenantSeries{{Tenant: 1}}},
	})
	if len(b) == 0 || len(b2) == 0 {
		t.Fatal("empty output")
	}
}

func TestRoundTripExtremes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, shards := range []uint32{1, 2, 16, 1024, MaxShards} {
		mask := uint64(shards - 1)
		last := shards - 1
		blocks := []block{
			// Lowest and highest hashes of the first and last shard, alone and in
			// pairs/triples, so min, max and the width of the range hit the limits.
			{0, []TenantSeries{
				{0, []uint64{0}, []uint8{0}},
				{1, []uint64{math.MaxUint64 &^ mask, 0}, []uint8{119, 1}},
				{2, []uint64{math.MaxUint64 &^ mask, 0, (1 << 40) &^ mask}, []uint8{5, 6, 7}},
				{3, []uint64{0, uint64(shards), 2 * uint64(shards)}, []uint8{1, 2, 3}},
			}},
		}
		if last != 0 {
			blocks = append(blocks, block{last, []TenantSeries{
				{0, []uint64{math.MaxUint64}, []uint8{119}},
				{4, []uint64{math.MaxUint64, uint64(last), math.MaxUint64 - uint64(shards)}, []uint8{0, 119, 60}},
			}})
		}
		// Full-width random hashes: wide low parts (> 56 bits) for small tenants.
		for n := 3; n < 80; n += 7 {
			ts := randTenant(r, 5, n, shards, last/2, 64, window(r, 0, 120))
			ts.Hashes[0] = uint64(last / 2)
			ts.Hashes[n-1] = math.MaxUint64&^mask | uint64(last/2)
			blocks = append(blocks, block{last / 2, []TenantSeries{ts}})
			checkRoundTrip(t, baseHeader(shards, 6), blocks[len(blocks)-1:])
			blocks = blocks[:len(blocks)-1]
		}
		checkRoundTrip(t, baseHeader(shards, 6), blocks)
	}
}

func TestRoundTripShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const shards = 8
	mk := func(shard uint32, vals []uint64) TenantSeries {
		ts := TenantSeries{}
		for _, v := range vals {
			ts.Hashes = append(ts.Hashes, v*shards+uint64(shard))
			ts.Minutes = append(ts.Minutes, uint8(r.IntN(120)))
		}
		return ts
	}
	var dense, clustered, stripes, twoClusters []uint64
	for i := range 5000 {
		dense = append(dense, uint64(1_000_000+i)) // L = 0
	}
	// A huge cluster plus outliers: a few enormous buckets (slices.Sort path).
	for i := range 50_000 {
		clustered = append(clustered, 1<<50+uint64(i)*3)
	}
	clustered = append(clustered, 0, 1<<60)
	for i := range 20_000 {
		stripes = append(stripes, uint64(i%100)<<40|uint64(i/100)) // many equal high parts
	}
	for i := range 30_000 {
		twoClusters = append(twoClusters, uint64(i), 1<<58+uint64(i)*7)
	}
	for name, vals := range map[string][]uint64{"dense": dense, "clustered": clustered, "stripes": stripes, "twoClusters": twoClusters} {
		t.Run(name, func(t *testing.T) {
			r.Shuffle(len(vals), func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
			checkRoundTrip(t, baseHeader(shards, 1), []block{{3, []TenantSeries{mk(3, vals)}}})
		})
	}
}

func TestRoundTripManyTenants(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const tenants, shards = 300, 4
	var blocks []block
	for s := uint32(0); s < shards; s++ {
		var series []TenantSeries
		for _, tn := range r.Perm(tenants) {
			if tn%7 == 3 {
				continue // absent from this shard
			}
			n := []int{1, 2, 3, 4, 10, 50, 200, 700}[r.IntN(8)]
			series = append(series, randTenant(r, uint32(tn), n, shards, s, 64, window(r, 30, 10)))
		}
		blocks = append(blocks, block{s, series})
	}
	// Shards in any order.
	blocks[0], blocks[3] = blocks[3], blocks[0]
	checkRoundTrip(t, baseHeader(shards, tenants), blocks)
}

func TestRoundTripMinutes(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for name, minute := range map[string]func() uint8{
		"constant":  func() uint8 { return 42 },
		"uniform":   window(r, 0, 120),
		"narrow":    window(r, 115, 3),
		"twoValues": func() uint8 { return uint8(r.IntN(2)) * 119 },
	} {
		t.Run(name, func(t *testing.T) {
			// 3 chunks of minutes in the big shard, small ones elsewhere (raw).
			for _, n := range []int{1, 31, 40, 5000, 2*minuteChunk + 17} {
				ts := randTenant(r, 0, n, 2, 1, 62, minute)
				checkRoundTrip(t, baseHeader(2, 1), []block{{1, []TenantSeries{ts}}})
			}
		})
	}
}

func TestMultiChunkAcrossTenants(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var series []TenantSeries
	for tn := range 5 {
		series = append(series, randTenant(r, uint32(tn), 70_000, 1, 0, 64, window(r, 0, 20)))
	}
	checkRoundTrip(t, baseHeader(1, 5), []block{{0, series}})
}

func TestDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const shards = 4
	var blocks []block
	for s := uint32(0); s < shards; s++ {
		var series []TenantSeries
		for tn := range 20 {
			series = append(series, randTenant(r, uint32(tn), 1+r.IntN(3000), shards, s, 62, window(r, 0, 20)))
		}
		blocks = append(blocks, block{s, series})
	}
	h := baseHeader(shards, 20)
	want := encodeBlocks(t, h, blocks)
	for range 3 {
		shuffled := make([]block, len(blocks))
		for i, bl := range blocks {
			ss := cloneSeries(bl.series)
			r.Shuffle(len(ss), func(i, j int) { ss[i], ss[j] = ss[j], ss[i] })
			for _, ts := range ss {
				r.Shuffle(len(ts.Hashes), func(i, j int) {
					ts.Hashes[i], ts.Hashes[j] = ts.Hashes[j], ts.Hashes[i]
					ts.Minutes[i], ts.Minutes[j] = ts.Minutes[j], ts.Minutes[i]
				})
			}
			// Already-sorted input must give the same bytes too.
			if i == 0 {
				ss = canon(ss)
			}
			shuffled[i] = block{bl.shard, ss}
		}
		if got := encodeBlocks(t, h, shuffled); !bytes.Equal(got, want) {
			t.Fatal("same content in another order gives different bytes")
		}
	}
	// A block's bytes do not depend on what the Writer encoded before it.
	other := encodeBlocks(t, h, []block{{0, []TenantSeries{randTenant(r, 0, 200_000, shards, 0, 64, window(r, 0, 120))}}, blocks[1]})
	spansA, _ := blockSpans(t, want)
	spansB, _ := blockSpans(t, other)
	a := want[spansA[1][0]:spansA[1][1]]
	b := other[spansB[1][0]:spansB[1][1]]
	if !bytes.Equal(a, b) {
		t.Fatal("block bytes depend on the previous block")
	}
	// The Writer leaves its input untouched.
	before := cloneSeries(blocks[2].series)
	encodeBlocks(t, h, blocks[2:3])
	for i := range before {
		if !slices.Equal(before[i].Hashes, blocks[2].series[i].Hashes) || !bytes.Equal(before[i].Minutes, blocks[2].series[i].Minutes) {
			t.Fatal("WriteShard modified its input")
		}
	}
}

func TestWriterRejects(t *testing.T) {
	h := baseHeader(4, 3)
	hs := func(v ...uint64) []uint64 { return v }
	ms := func(n int) []uint8 { return make([]uint8, n) }
	big := func(mod func([]uint64, []uint8)) TenantSeries {
		r := rand.New(rand.NewPCG(1, 1))
		ts := randTenant(r, 0, 1000, 4, 1, 62, window(r, 0, 20))
		mod(ts.Hashes, ts.Minutes)
		return ts
	}
	cases := map[string][]TenantSeries{
		"wrong shard":           {{0, hs(5, 9, 2), ms(3)}},
		"wrong shard single":    {{0, hs(4), ms(1)}},
		"wrong shard big":       {big(func(h []uint64, _ []uint8) { h[500] &^= 3 })},
		"duplicate pair":        {{0, hs(5, 5), ms(2)}},
		"duplicate min":         {{0, hs(5, 9, 5, 13), ms(4)}},
		"duplicate max":         {{0, hs(13, 9, 5, 13), ms(4)}},
		"duplicate inner":       {{0, hs(5, 9, 21, 9, 13, 101), ms(6)}},
		"duplicate big min":     {big(func(h []uint64, _ []uint8) { h[3] = slices.Min(h) })},
		"duplicate big inner":   {big(func(h []uint64, _ []uint8) { h[3] = h[700] })},
		"minute 120":            {{0, hs(5, 9), []uint8{3, 120}}},
		"minute 255 big":        {big(func(_ []uint64, m []uint8) { m[999] = 255 })},
		"length mismatch":       {{0, hs(5, 9), ms(1)}},
		"tenant out of range":   {{3, hs(5), ms(1)}},
		"tenant twice":          {{1, hs(5), ms(1)}, {1, hs(9), ms(1)}},
		"tenant twice, 1 empty": {{1, hs(5), ms(1)}, {0, nil, nil}, {1, nil, nil}},
	}
	for name, series := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := NewWriter(&buf, h)
			if err != nil {
				t.Fatal(err)
			}
			n := buf.Len()
			err = w.WriteShard(1, series)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if buf.Len() != n {
				t.Fatal("bytes written despite the error")
			}
			// The writer stays usable.
			if err := w.WriteShard(1, []TenantSeries{{0, hs(1, 5), ms(2)}}); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := decodeBlocks(buf.Bytes()); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("shard twice or out of range", func(t *testing.T) {
		w, _ := NewWriter(io.Discard, h)
		if err := w.WriteShard(4, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("shard 4: %v", err)
		}
		if err := w.WriteShard(2, []TenantSeries{{0, hs(2), ms(1)}}); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteShard(2, []TenantSeries{{1, hs(6), ms(1)}}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("shard 2 again: %v", err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteShard(3, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("after Close: %v", err)
		}
	})
	for name, bad := range map[string]Header{
		"shards 0":        {Partitions: 4, Shards: 0, GroupHi: 1},
		"shards 12":       {Partitions: 4, Shards: 12, GroupHi: 1},
		"shards too many": {Partitions: 4, Shards: 2 * MaxShards, GroupHi: 1},
		"partitions 0":    {Partitions: 0, Shards: 1, GroupHi: 1},
		"empty group":     {Partitions: 4, Shards: 1, GroupLo: 2, GroupHi: 2},
		"group beyond P":  {Partitions: 4, Shards: 1, GroupLo: 2, GroupHi: 5},
		"meta too big":    {Partitions: 4, Shards: 1, GroupHi: 1, Meta: make([]byte, MaxMetaSize+1)},
		"empty tenant":    {Partitions: 4, Shards: 1, GroupHi: 1, Tenants: []string{"a", ""}},
		"long tenant":     {Partitions: 4, Shards: 1, GroupHi: 1, Tenants: []string{strings.Repeat("x", MaxTenantNameLen+1)}},
		"tenant twice":    {Partitions: 4, Shards: 1, GroupHi: 1, Tenants: []string{"a", "b", "a"}},
	} {
		if _, err := NewWriter(io.Discard, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("header %s: err = %v, want ErrInvalid", name, err)
		}
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n < len(p) {
		return 0, errors.New("disk full")
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriterIOError(t *testing.T) {
	h := baseHeader(4, 1)
	if _, err := NewWriter(&failWriter{}, h); err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("header write: %v", err)
	}
	w, err := NewWriter(&failWriter{n: 1000}, h)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	err = w.WriteShard(0, []TenantSeries{randTenant(r, 0, 5000, 4, 0, 62, window(r, 0, 20))})
	if err == nil {
		t.Fatal("no error")
	}
	if err2 := w.WriteShard(1, nil); err2 != err {
		t.Fatalf("error not sticky: %v", err2)
	}
	if err2 := w.Close(); err2 != err {
		t.Fatalf("Close: %v", err2)
	}
}

func TestInspect(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	h := baseHeader(8, 4)
	var blocks []block
	wantT := make([]uint64, 4)
	wantS := make([]uint64, 8)
	var wantM [MaxMinute + 1]uint64
	total := uint64(0)
	for _, s := range []uint32{6, 1, 3} {
		var series []TenantSeries
		for tn := range 4 {
			if tn == 2 && s == 1 {
				continue
			}
			n := 1 + r.IntN(5000)
			ts := randTenant(r, uint32(tn), n, 8, s, 62, window(r, 50, 30))
			series = append(series, ts)
			wantT[tn] += uint64(n)
			wantS[s] += uint64(n)
			total += uint64(n)
			for _, m := range ts.Minutes {
				wantM[m]++
			}
		}
		blocks = append(blocks, block{s, series})
	}
	b := encodeBlocks(t, h, blocks)
	sum, err := Inspect(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Series != total || sum.Blocks != 3 || sum.Bytes != int64(len(b)) ||
		!slices.Equal(sum.TenantSeries, wantT) || !slices.Equal(sum.ShardSeries, wantS) || sum.Minutes != wantM ||
		!slices.Equal(sum.Header.Tenants, h.Tenants) || sum.Header.Index != h.Index {
		t.Fatalf("summary %+v", sum)
	}
	if _, err := Inspect(bytes.NewReader(b[:len(b)-1])); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

func TestReaderReuse(t *testing.T) {
	// Slices returned by Next are reused: a caller that copies gets the right
	// data, and a later, larger block does not corrupt earlier copies.
	r := rand.New(rand.NewPCG(17, 18))
	blocks := []block{
		{0, []TenantSeries{randTenant(r, 0, 10, 2, 0, 64, window(r, 0, 5))}},
		{1, []TenantSeries{randTenant(r, 0, 50_000, 2, 1, 64, window(r, 0, 5))}},
	}
	checkRoundTrip(t, baseHeader(2, 1), blocks)
}
