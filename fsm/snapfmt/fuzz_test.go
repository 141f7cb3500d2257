package snapfmt

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// fuzzSeeds are small valid snapshots (small inputs keep the fuzzer's
// minimization fast) covering every encoding path: 1, 2 and 3+ series per
// tenant, wide (S=1) and narrow low parts, raw, run-length and Huffman minutes.
func fuzzSeeds(tb testing.TB) [][]byte {
	r := rand.New(rand.NewPCG(31, 32))
	return [][]byte{
		encodeBlocks(tb, Header{Partitions: 1, Shards: 1, GroupHi: 1}, nil),
		encodeBlocks(tb, baseHeader(1, 2), []block{{0, []TenantSeries{
			{0, []uint64{0, math.MaxUint64, 1 << 63}, []uint8{0, 119, 60}},
			randTenant(r, 1, 9, 1, 0, 64, window(r, 0, 120)),
		}}}),
		encodeBlocks(tb, baseHeader(8, 3), []block{
			{7, []TenantSeries{randTenant(r, 2, 40, 8, 7, 24, window(r, 100, 4))}},
			{1, []TenantSeries{
				randTenant(r, 0, 1, 8, 1, 64, window(r, 0, 2)),
				randTenant(r, 1, 2, 8, 1, 64, window(r, 0, 2)),
				randTenant(r, 2, 6, 8, 1, 20, func() uint8 { return 3 }),
			}},
		}),
	}
}

// FuzzReader feeds arbitrary bytes to the Reader, optionally with all checksums
// recomputed (reseal) so the field checks behind them are reached. The Reader
// must never panic, must report failures as ErrCorrupt, and whatever it
// accepts must be valid content that re-encodes to the same series.
//
//	go test -run '^$' -fuzz FuzzReader -fuzztime 60s ./fsm/snapfmt/
func FuzzReader(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, resealIt bool) {
		if resealIt {
			data = reseal(data)
		}
		h, blocks, err := decodeBlocks(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if err := checkDecoded(h, blocks); err != nil {
			t.Fatalf("accepted invalid content: %v", err)
		}
		again := encodeBlocks(t, h, blocks)
		_, back, err := decodeBlocks(again)
		if err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if len(back) != len(blocks) {
			t.Fatalf("re-encoded snapshot has %d blocks, want %d", len(back), len(blocks))
		}
		for i := range back {
			if back[i].shard != blocks[i].shard {
				t.Fatal("shard changed")
			}
			if err := equalSeries(back[i].series, blocks[i].series); err != nil {
				t.Fatalf("re-encoded content differs: %v", err)
			}
		}
		sum, err := Inspect(bytes.NewReader(data))
		if err != nil || sum.Blocks != len(blocks) || sum.Bytes != int64(len(data)) {
			t.Fatalf("Inspect disagrees: %v %+v", err, sum)
		}
	})
}
