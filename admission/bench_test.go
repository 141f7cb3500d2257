package admission

import (
	"context"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/seriesmap"
)

// mix spreads sequential numbers over the hash space (and so over shards), as
// real series hashes are.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// freshHashes fills hashes with the series after *next, moving it on: every call
// gives hashes never given before.
func freshHashes(hashes []uint64, next *uint64) {
	for j := range hashes {
		*next++
		hashes[j] = mix(*next)
	}
}

// BenchmarkLeaderPath measures the server's hot path below gRPC: one Track call
// of 1,000 hashes goes through the session (batch, committed-state lookup,
// Decide, reservation, entry encoding) and a fake log that applies the entry to a
// real FSM at once, then the reply. "new" creates 1,000 series per call;
// "refresh" re-sends 1,000 active series last seen a minute earlier, which are
// logged as refreshes.
func BenchmarkLeaderPath(b *testing.B) {
	const perReq = 1000
	b.Run("new", func(b *testing.B) {
		h := newHarness(b, nil, func(l *fakeLog) { l.noRecord = true })
		h.tr.SetLeader(true)
		h.waitReady()
		hashes := make([]uint64, perReq)
		var next uint64
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			freshHashes(hashes, &next)
			if rej, err := h.tr.Track(context.Background(), "tenant", hashes); err != nil || len(rej) != 0 {
				b.Fatalf("rejected %d, err %v", len(rej), err)
			}
		}
		b.ReportMetric(float64(b.N*perReq)/b.Elapsed().Seconds(), "series/s")
		reportCPU(b, cpu, b.N*perReq)
	})
	b.Run("map-floor", func(b *testing.B) {
		// The floor under "new": the series map's own work for the same
		// hashes and no more — per shard (the harness's 4), one GetMany that
		// misses and one PutMany that inserts, into tables that grow as the
		// FSM's do. "new" ÷ this, in one run, is what the admission path
		// (batching, Decide, reservation, encoding, decoding, the FSM's
		// bookkeeping) costs on top of the map.
		const shards = 4
		tables := make([]*seriesmap.Table, shards)
		for s := range tables {
			tables[s] = seriesmap.New(0)
		}
		hashes := make([]uint64, perReq)
		byShard := make([][]uint64, shards)
		mins := make([]uint8, perReq)
		found := make([]bool, perReq)
		var next uint64
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			freshHashes(hashes, &next)
			for s := range byShard {
				byShard[s] = byShard[s][:0]
			}
			for _, h := range hashes {
				byShard[h&(shards-1)] = append(byShard[h&(shards-1)], h)
			}
			created := 0
			for s, hs := range byShard {
				tables[s].GetMany(hs, mins[:len(hs)], found[:len(hs)])
				if slices.Contains(found[:len(hs)], true) {
					b.Fatal("a new hash was found")
				}
				created += tables[s].PutMany(hs, testMinute%120)
			}
			if created != perReq {
				b.Fatalf("%d created, want %d", created, perReq)
			}
		}
		b.ReportMetric(float64(b.N*perReq)/b.Elapsed().Seconds(), "series/s")
		reportCPU(b, cpu, b.N*perReq)
	})
	b.Run("refresh", func(b *testing.B) {
		// A pool of requests whose series are active: each pass over the pool
		// moves the clock one minute on, so every request is a refresh again.
		const pool = 256
		var minute atomic.Int64
		var counted countMetrics
		minute.Store(testMinute)
		reqs := make([][]uint64, pool)
		h := newHarness(b, nil, func(l *fakeLog) {
			for i := range reqs {
				reqs[i] = make([]uint64, perReq)
				for j := range reqs[i] {
					reqs[i][j] = mix(uint64(i*perReq + j))
				}
				l.commit(fsm.AppendTrack(nil, testMinute, []fsm.TenantHashes{{Tenant: "tenant", Hashes: reqs[i], New: perReq}}))
			}
			l.noRecord = true
		}, func(c *Config) {
			c.Clock = func() time.Time { return time.Unix(minute.Load()*60, 0) }
			c.Metrics = &counted
		})
		h.tr.SetLeader(true)
		h.waitReady()
		i := 0
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			if i%pool == 0 {
				minute.Add(1)
			}
			if rej, err := h.tr.Track(context.Background(), "tenant", reqs[i%pool]); err != nil || len(rej) != 0 {
				b.Fatalf("rejected %d, err %v", len(rej), err)
			}
			i++
		}
		b.StopTimer()
		if a, _ := h.f.TenantUsage("tenant"); a != pool*perReq {
			b.Fatalf("%d active series, want %d: refreshes must not create or drop series", a, pool*perReq)
		}
		if refreshed := counted.refreshed.Load(); refreshed != int64(b.N*perReq) || counted.created.Load() != 0 {
			b.Fatalf("%d refreshes and %d new logged, want %d and 0", refreshed, counted.created.Load(), b.N*perReq)
		}
		b.ReportMetric(float64(b.N*perReq)/b.Elapsed().Seconds(), "series/s")
		reportCPU(b, cpu, b.N*perReq)
	})
}

// processCPU is the process's user and system CPU so far. The end-to-end
// figure it is compared with (scripts/cost-ratio.sh) is the server's CPU per
// series, garbage collection and every goroutine included; ns/op is one
// goroutine's wall time, which leaves out the collector's work on other
// cores. So the benchmarks report both.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU since start per series, as cpu-ns/series.
func reportCPU(b *testing.B, start time.Duration, series int) {
	b.ReportMetric(float64(processCPU(b)-start)/float64(series), "cpu-ns/series")
}

// countMetrics counts decisions so the benchmark can check what it measured.
type countMetrics struct{ created, refreshed, rejected atomic.Int64 }

func (m *countMetrics) SeriesDecided(created, refreshed, rejected int) {
	m.created.Add(int64(created))
	m.refreshed.Add(int64(refreshed))
	m.rejected.Add(int64(rejected))
}
func (m *countMetrics) EntryAppended(int, int)      {}
func (m *countMetrics) CommitLatency(time.Duration) {}
