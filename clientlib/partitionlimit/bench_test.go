package partitionlimit

import (
	"math/rand/v2"
	"testing"

	"github.com/axiomhq/hyperloglog"

	"github.com/tollgate-io/tollgate/api"
)

// benchRequest returns n series over parts partitions.
func benchRequest(r *rand.Rand, n, parts int) []Series {
	req := make([]Series, parts)
	for i := range req {
		req[i].Partition = int32(i)
	}
	for i := range n {
		req[i%parts].Hashes = append(req[i%parts].Hashes, r.Uint64())
	}
	return req
}

// BenchmarkCheck: one 1,000-series request over 16 partitions (the product rules hot
// path). existing: the series are already in the window (the common case of a
// steady workload); new: every request brings 1,000 new series, so registers
// rise and the undo log and change marks are exercised.
func BenchmarkCheck(b *testing.B) {
	for _, p := range []int{11, 14} {
		b.Run("p="+itoa(p)+"/existing", func(b *testing.B) {
			l, _ := New(Config{Precision: p, Limits: LimitsFunc(func(string) int64 { return 1 << 40 })})
			defer l.Close()
			req := benchRequest(rand.New(rand.NewPCG(1, 1)), 1000, 16)
			_ = l.Check("t", req)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := l.Check("t", req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("p="+itoa(p)+"/new", func(b *testing.B) {
			l, _ := New(Config{Precision: p, Limits: LimitsFunc(func(string) int64 { return 1 << 40 })})
			defer l.Close()
			r := rand.New(rand.NewPCG(2, 2))
			reqs := make([][]Series, 64)
			for i := range reqs {
				reqs[i] = benchRequest(r, 1000, 16)
			}
			_ = l.Check("t", reqs[0])
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				req := reqs[i%len(reqs)]
				i++
				for j := range req { // fresh series, no allocation
					for k := range req[j].Hashes {
						req[j].Hashes[k] += 0x9e3779b97f4a7c15
					}
				}
				if err := l.Check("t", req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckAxiomhq is the baseline: the same check done the reference implementation's way
// with github.com/axiomhq/hyperloglog v0.3.0 sketches per partition: clone the
// merged window sketch, insert the request, Estimate (a pass over all m
// registers), and on success merge the request into the current minute.
func BenchmarkCheckAxiomhq(b *testing.B) {
	for _, p := range []uint8{11, 14} {
		b.Run("p="+itoa(int(p))+"/existing", func(b *testing.B) {
			req := benchRequest(rand.New(rand.NewPCG(1, 1)), 1000, 16)
			window := make([]*hyperloglog.Sketch, 16)
			current := make([]*hyperloglog.Sketch, 16)
			for i := range window {
				window[i], _ = hyperloglog.NewSketch(p, false)
				current[i], _ = hyperloglog.NewSketch(p, false)
				for _, h := range req[i].Hashes {
					window[i].InsertHash(api.MixHash(h))
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				ok := true
				for i, s := range req {
					c := window[i].Clone()
					for _, h := range s.Hashes {
						c.InsertHash(api.MixHash(h))
					}
					if c.Estimate() > 1<<40 {
						ok = false
						break
					}
				}
				if ok {
					for i, s := range req {
						for _, h := range s.Hashes {
							current[i].InsertHash(api.MixHash(h))
						}
					}
				}
			}
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
