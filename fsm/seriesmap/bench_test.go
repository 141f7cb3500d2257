package seriesmap

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// The benchmarks compare Table with the builtin map[uint64]uint8 on the same
// keys, in two layouts:
//
//   - "1M": one table of 1,000,000 random series;
//   - "tables": 10M random series of 1,000 tenants in the FSM's layout, one
//     table per (tenant, group, shard) with 4 groups × 16 shards, so 64,000
//     tables of ~156 series. Series reach a table in runs of 16 (a request's
//     hashes for one shard), tables in random order.
//
// Throughput benchmarks report ns/key (ns/op is one pass over all keys).
// "seriesmap" calls Put (or Get) per key, "seriesmap-batch" calls PutMany per
// run of keys, "builtin" is map[uint64]uint8 with the same keys in the same
// order. The machine is noisy: compare medians of several counts, e.g.
//
//	go test -run='^$' -bench='Insert|Refresh|Lookup' -benchtime=3x -count=5 ./fsm/seriesmap/
//
// The memory benchmark builds each layout once per iteration and reports the
// heap growth per series after a GC; run it alone, once per count:
//
//	go test -run='^$' -bench=MapMemory -benchtime=1x -count=5 ./fsm/seriesmap/

const (
	benchTenants = 1000
	benchGroups  = 4
	benchShards  = 16
	benchTables  = benchTenants * benchGroups * benchShards
	benchSeries  = 10_000_000
	benchRun     = 16
)

// tableOf returns the FSM table a series of tenant belongs to: its group is the
// hash's top bits (contiguous ranges), its shard its low bits.
func tableOf(tenant int, h uint64) int {
	return (tenant*benchGroups+int(h>>62))*benchShards + int(h&(benchShards-1))
}

// workload is a sequence of runs of keys, each run for one table.
type workload struct {
	nTables int
	keys    []uint64 // in arrival order
	runs    []run
}

type run struct {
	table    uint32
	off, end uint32
}

var (
	workloadOnce sync.Map // name → *workload
)

func getWorkload(name string) *workload {
	if w, ok := workloadOnce.Load(name); ok {
		return w.(*workload)
	}
	var w *workload
	switch name {
	case "1M":
		w = singleWorkload(1_000_000)
	case "tables":
		w = tablesWorkload()
	default:
		panic(name)
	}
	workloadOnce.Store(name, w)
	return w
}

func singleWorkload(n int) *workload {
	r := rand.New(rand.NewPCG(11, 12))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	return &workload{nTables: 1, keys: keys, runs: []run{{0, 0, uint32(n)}}}
}

func tablesWorkload() *workload {
	r := rand.New(rand.NewPCG(13, 14))
	per := make([][]uint64, benchTables)
	for range benchSeries {
		h := r.Uint64()
		t := tableOf(r.IntN(benchTenants), h)
		per[t] = append(per[t], h)
	}
	w := &workload{nTables: benchTables, keys: make([]uint64, 0, benchSeries)}
	for off := 0; len(w.keys) < benchSeries; off += benchRun {
		for _, t := range r.Perm(benchTables) {
			ks := per[t]
			if off >= len(ks) {
				continue
			}
			ks = ks[off:min(off+benchRun, len(ks))]
			start := len(w.keys)
			w.keys = append(w.keys, ks...)
			w.runs = append(w.runs, run{uint32(t), uint32(start), uint32(len(w.keys))})
		}
	}
	return w
}

var layouts = []string{"1M", "tables"}

func reportPerKey(b *testing.B, keys int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(keys), "ns/key")
}

func (w *workload) fillTables(batch bool) []*Table {
	ts := make([]*Table, w.nTables)
	for i := range ts {
		ts[i] = New(0)
	}
	for _, r := range w.runs {
		t := ts[r.table]
		if batch {
			t.PutMany(w.keys[r.off:r.end], 1)
			continue
		}
		for _, h := range w.keys[r.off:r.end] {
			t.Put(h, 1)
		}
	}
	return ts
}

func (w *workload) fillMaps() []map[uint64]uint8 {
	ms := make([]map[uint64]uint8, w.nTables)
	for i := range ms {
		ms[i] = map[uint64]uint8{}
	}
	for _, r := range w.runs {
		m := ms[r.table]
		for _, h := range w.keys[r.off:r.end] {
			m[h] = 1
		}
	}
	return ms
}

// BenchmarkInsert inserts every key into fresh empty tables (growth included).
func BenchmarkInsert(b *testing.B) {
	for _, l := range layouts {
		b.Run(l+"/seriesmap", func(b *testing.B) {
			w := getWorkload(l)
			b.ResetTimer()
			for range b.N {
				w.fillTables(false)
			}
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/seriesmap-batch", func(b *testing.B) {
			w := getWorkload(l)
			b.ResetTimer()
			for range b.N {
				w.fillTables(true)
			}
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/builtin", func(b *testing.B) {
			w := getWorkload(l)
			b.ResetTimer()
			for range b.N {
				w.fillMaps()
			}
			reportPerKey(b, len(w.keys))
		})
	}
}

// BenchmarkRefresh overwrites the minute of existing keys.
func BenchmarkRefresh(b *testing.B) {
	for _, l := range layouts {
		b.Run(l+"/seriesmap", func(b *testing.B) {
			w := getWorkload(l)
			ts := w.fillTables(false)
			b.ResetTimer()
			for i := range b.N {
				m := uint8(i % 120)
				for _, r := range w.runs {
					t := ts[r.table]
					for _, h := range w.keys[r.off:r.end] {
						t.Put(h, m)
					}
				}
			}
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/seriesmap-batch", func(b *testing.B) {
			w := getWorkload(l)
			ts := w.fillTables(false)
			b.ResetTimer()
			for i := range b.N {
				m := uint8(i % 120)
				for _, r := range w.runs {
					ts[r.table].PutMany(w.keys[r.off:r.end], m)
				}
			}
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/builtin", func(b *testing.B) {
			w := getWorkload(l)
			ms := w.fillMaps()
			b.ResetTimer()
			for i := range b.N {
				v := uint8(i % 120)
				for _, r := range w.runs {
					m := ms[r.table]
					for _, h := range w.keys[r.off:r.end] {
						m[h] = v
					}
				}
			}
			reportPerKey(b, len(w.keys))
		})
	}
}

var sink int

// BenchmarkLookup reads the minute of existing keys.
func BenchmarkLookup(b *testing.B) {
	for _, l := range layouts {
		b.Run(l+"/seriesmap", func(b *testing.B) {
			w := getWorkload(l)
			ts := w.fillTables(false)
			b.ResetTimer()
			s := 0
			for range b.N {
				for _, r := range w.runs {
					t := ts[r.table]
					for _, h := range w.keys[r.off:r.end] {
						m, _ := t.Get(h)
						s += int(m)
					}
				}
			}
			sink = s
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/seriesmap-many", func(b *testing.B) {
			w := getWorkload(l)
			ts := w.fillTables(false)
			mins := make([]uint8, len(w.keys))
			found := make([]bool, len(w.keys))
			b.ResetTimer()
			s := 0
			for range b.N {
				for _, r := range w.runs {
					ts[r.table].GetMany(w.keys[r.off:r.end], mins[r.off:r.end], found[r.off:r.end])
				}
				s += int(mins[0])
			}
			sink = s
			reportPerKey(b, len(w.keys))
		})
		b.Run(l+"/builtin", func(b *testing.B) {
			w := getWorkload(l)
			ms := w.fillMaps()
			b.ResetTimer()
			s := 0
			for range b.N {
				for _, r := range w.runs {
					m := ms[r.table]
					for _, h := range w.keys[r.off:r.end] {
						s += int(m[h])
					}
				}
			}
			sink = s
			reportPerKey(b, len(w.keys))
		})
	}
}

// BenchmarkLookupAbsent reads keys that are not in the tables, as the leader
// does for every new series before it admits it: each key is a stored key
// with bit 30 flipped, so it belongs to the same table. A lookup that misses
// must probe until it can rule the key out, which at high load costs several
// times a hit (compare BenchmarkLookup's seriesmap-many).
func BenchmarkLookupAbsent(b *testing.B) {
	for _, l := range layouts {
		b.Run(l+"/seriesmap-many", func(b *testing.B) {
			w := getWorkload(l)
			ts := w.fillTables(false)
			absent := make([]uint64, len(w.keys))
			for i, h := range w.keys {
				absent[i] = h ^ 1<<30
			}
			mins := make([]uint8, len(w.keys))
			found := make([]bool, len(w.keys))
			b.ResetTimer()
			n := 0
			for range b.N {
				for _, r := range w.runs {
					ts[r.table].GetMany(absent[r.off:r.end], mins[r.off:r.end], found[r.off:r.end])
				}
				if found[0] {
					n++
				}
			}
			sink = n
			reportPerKey(b, len(w.keys))
		})
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMapMemory reports the heap held per series (bytes/series): 10M
// random series over 1,000 tenants, in the FSM layout ("tables") and in a
// single table ("single"), for Table and for the builtin map. Series are
// generated on the fly, so only the tables are measured. Run with
// -benchtime=1x.
func BenchmarkMapMemory(b *testing.B) {
	build := func(b *testing.B, name string, single, builtin bool) {
		b.Run(name, func(b *testing.B) {
			var perSeries float64
			for range b.N {
				nTables := benchTables
				if single {
					nTables = 1
				}
				before := heapAlloc()
				r := rand.New(rand.NewPCG(21, 22))
				var keep any
				if builtin {
					ms := make([]map[uint64]uint8, nTables)
					for i := range ms {
						ms[i] = map[uint64]uint8{}
					}
					for range benchSeries {
						h := r.Uint64()
						t := 0
						if !single {
							t = tableOf(r.IntN(benchTenants), h)
						}
						ms[t][h] = uint8(r.IntN(120))
					}
					keep = ms
				} else {
					ts := make([]*Table, nTables)
					for i := range ts {
						ts[i] = New(0)
					}
					for range benchSeries {
						h := r.Uint64()
						t := 0
						if !single {
							t = tableOf(r.IntN(benchTenants), h)
						}
						ts[t].Put(h, uint8(r.IntN(120)))
					}
					keep = ts
				}
				after := heapAlloc()
				runtime.KeepAlive(keep)
				perSeries = float64(after-before) / benchSeries
			}
			b.ReportMetric(perSeries, "bytes/series")
			b.ReportMetric(0, "ns/op")
		})
	}
	build(b, "tables/seriesmap", false, false)
	build(b, "tables/builtin", false, true)
	build(b, "single/seriesmap", true, false)
	build(b, "single/builtin", true, true)
}

// BenchmarkMissProbe reports how many buckets a lookup that misses (and an
// insert) crosses at a segment's load, from a random home bucket: the cost of
// linear probing near the growth load, which is why a lookup of a new series
// costs several times a hit. One op is 100,000 probes.
//
//	go test -run='^$' -bench=MissProbe -benchtime=1x ./fsm/seriesmap/
func BenchmarkMissProbe(b *testing.B) {
	for _, load := range []int{70, 80, 85, 90, 95} {
		b.Run(fmt.Sprintf("load=%d%%", load), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			s := &seg{}
			s.alloc(3000)
			s.growAt = s.nb * slotsPerBucket // no growth: fill to the load asked
			for int(s.count)*100 < int(s.nb)*slotsPerBucket*load {
				h := r.Uint64() | 1
				s.put(h, h*mixer, 1)
			}
			total := 0
			for range b.N {
				for range 100_000 {
					bk := uint32(r.IntN(int(s.nb)))
					total++
					for match(s.bucket(bk), 0) == 0 {
						total++
						if bk++; bk == s.nb {
							bk = 0
						}
					}
				}
			}
			b.ReportMetric(float64(total)/float64(b.N*100_000), "buckets/miss")
		})
	}
}

// BenchmarkRestore builds one table of n series from ascending hashes, as a
// snapshot restore does: FromSorted against New(n) and Put for each. At 100 M
// series a node's tables hold about 1.5 M each (4 groups × 16 shards, one
// tenant).
func BenchmarkRestore(b *testing.B) {
	for _, n := range []int{20_000, 1_500_000} {
		r := rand.New(rand.NewPCG(3, 4))
		hs := make([]uint64, n)
		ms := make([]uint8, n)
		for i := range hs {
			hs[i] = r.Uint64()
			ms[i] = uint8(r.IntN(120))
		}
		slices.Sort(hs)
		hs = slices.Compact(hs)
		ms = ms[:len(hs)]
		b.Run(fmt.Sprintf("n=%d/FromSorted", n), func(b *testing.B) {
			for range b.N {
				t, err := FromSorted(hs, ms)
				if err != nil {
					b.Fatal(err)
				}
				sink = t.Len()
			}
			reportPerKey(b, len(hs))
		})
		b.Run(fmt.Sprintf("n=%d/Put", n), func(b *testing.B) {
			for range b.N {
				t := New(len(hs))
				for i, h := range hs {
					t.Put(h, ms[i])
				}
				sink = t.Len()
			}
			reportPerKey(b, len(hs))
		})
	}
}
