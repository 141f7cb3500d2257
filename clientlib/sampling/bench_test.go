package sampling

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

// naive is the baseline the benchmarks compare with: the obvious
// implementation, nested maps of float percentages behind a RWMutex.
type naive struct {
	mu     sync.RWMutex
	global map[string]float64
	keys   map[string]map[string]float64
}

func (n *naive) shouldSample(key, kind string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	p := 100.0
	if m, ok := n.keys[key]; ok {
		if v, ok := m[kind]; ok {
			p = v
		}
	}
	if g, ok := n.global[kind]; ok {
		p = p * g / 100
	}
	return rand.Float64()*100 < p
}

// benchRates has 1,000 keys and two kinds, like a modest production config.
func benchRates() (Rates, []string) {
	r := Rates{Version: 1, Global: map[string]float64{"locate": 50, "submit": 100},
		Keys: map[string]map[string]float64{}}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
		r.Keys[keys[i]] = map[string]float64{"locate": float64(i % 100), "submit": 60}
	}
	return r, keys
}

func benchSampler(b *testing.B, o Options) (*Sampler, []string) {
	r, keys := benchRates()
	s := New(o)
	if err := s.Update(r); err != nil {
		b.Fatal(err)
	}
	return s, keys
}

var sink bool

// serial runs f b.N times on one locked OS thread and reports, besides the
// wall ns/op, the thread's CPU ns/op (Linux), the figure BENCHMARKS.md quotes
// when other work shares the cores.
func serial(b *testing.B, f func(i int)) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	start, ok := threadCPU()
	n := 0
	for i := 0; b.Loop(); i++ {
		f(i)
		n++
	}
	if end, ok2 := threadCPU(); ok && ok2 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
}

func BenchmarkShouldSample(b *testing.B) {
	s, keys := benchSampler(b, Options{})
	serial(b, func(i int) { sink = s.ShouldSample(keys[i&511], "locate") })
}

func BenchmarkShouldSampleItem(b *testing.B) {
	s, keys := benchSampler(b, Options{})
	serial(b, func(i int) { sink = s.ShouldSampleItem(keys[i&511], "locate", uint64(i)) })
}

// BenchmarkShouldSamplePerKeyStats is the cost with per-key counters on.
func BenchmarkShouldSamplePerKeyStats(b *testing.B) {
	s, keys := benchSampler(b, Options{MaxKeys: 1000})
	for _, k := range keys[:512] { // first sight of a key allocates its counters
		s.ShouldSample(k, "locate")
	}
	serial(b, func(i int) { sink = s.ShouldSample(keys[i&511], "locate") })
}

func BenchmarkShouldSampleParallel(b *testing.B) {
	s, keys := benchSampler(b, Options{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			sink = s.ShouldSample(keys[i&511], "locate")
			i++
		}
	})
}

func BenchmarkBaselineNaive(b *testing.B) {
	r, keys := benchRates()
	n := &naive{global: r.Global, keys: r.Keys}
	serial(b, func(i int) { sink = n.shouldSample(keys[i&511], "locate") })
}

func BenchmarkBaselineNaiveParallel(b *testing.B) {
	r, keys := benchRates()
	n := &naive{global: r.Global, keys: r.Keys}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			sink = n.shouldSample(keys[i&511], "locate")
			i++
		}
	})
}
