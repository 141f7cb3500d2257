package snapfmt

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// mix62 is a bijection on [0, 2^62): distinct inputs give distinct, random-looking
// outputs, so generated hashes never collide.
func mix62(x uint64) uint64 {
	const m = 1<<62 - 1
	x &= m
	x ^= x >> 29
	x = x * 0xbf58476d1ce4e5b9 & m
	x ^= x >> 32
	x = x * 0x94d049bb133111eb & m
	x ^= x >> 29
	return x
}

// benchData builds n distinct random hashes of one group (P=64, partitions
// [0,16): the top two bits are zero), split into S=16 shards and spread
// uniformly over the given number of tenants, with minutes uniform over a
// 20-minute window that wraps around the 120-minute ring.
func benchData(n, tenants int) (Header, [][]TenantSeries) {
	const shards = 16
	r := rand.New(rand.NewPCG(42, uint64(tenants)))
	h := Header{Partitions: 64, Shards: shards, GroupLo: 0, GroupHi: 16, Index: 123456, Term: 7, Meta: []byte("bench")}
	for t := range tenants {
		h.Tenants = append(h.Tenants, fmt.Sprintf("tenant-%04d", t))
	}
	data := make([][]TenantSeries, shards)
	for s := range data {
		data[s] = make([]TenantSeries, tenants)
		for t := range data[s] {
			data[s][t].Tenant = uint32(t)
		}
	}
	seed := r.Uint64()
	for i := range n {
		hash := mix62(uint64(i) + seed)
		ts := &data[hash&(shards-1)][r.IntN(tenants)]
		ts.Hashes = append(ts.Hashes, hash)
		ts.Minutes = append(ts.Minutes, uint8((110+r.IntN(20))%120))
	}
	return h, data
}

func encodeAll(tb testing.TB, out *bytes.Buffer, h Header, data [][]TenantSeries) {
	w, err := NewWriter(out, h)
	if err != nil {
		tb.Fatal(err)
	}
	for s, series := range data {
		if err := w.WriteShard(uint32(s), series); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
}

func decodeAll(tb testing.TB, in []byte) int {
	rd, err := NewReader(bytes.NewReader(in))
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for {
		_, series, err := rd.Next()
		if err == io.EOF {
			return n
		}
		if err != nil {
			tb.Fatal(err)
		}
		for _, ts := range series {
			n += len(ts.Hashes)
		}
	}
}

// BenchmarkSnapshot encodes and decodes 10M series per iteration, timing each
// direction separately. Run with:
//
//	go test -run '^$' -bench BenchmarkSnapshot -count 5 ./fsm/snapfmt/
func BenchmarkSnapshot(b *testing.B) {
	const n = 10_000_000
	for _, tenants := range []int{1, 1000} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			h, data := benchData(n, tenants)
			var out bytes.Buffer
			out.Grow(8 * n)
			var enc, dec time.Duration
			b.ResetTimer()
			for b.Loop() {
				out.Reset()
				t0 := time.Now()
				encodeAll(b, &out, h, data)
				t1 := time.Now()
				if got := decodeAll(b, out.Bytes()); got != n {
					b.Fatalf("decoded %d series, want %d", got, n)
				}
				enc += t1.Sub(t0)
				dec += time.Since(t1)
			}
			b.ReportMetric(float64(out.Len())/n, "bytes/series")
			b.ReportMetric(float64(n)*float64(b.N)/enc.Seconds(), "encode_series/s")
			b.ReportMetric(float64(n)*float64(b.N)/dec.Seconds(), "decode_series/s")
		})
	}
}
