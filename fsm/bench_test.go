package fsm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkApplyTrack measures the FSM side of the leader path: decoding one
// 1,000-hash track entry and upserting it. "new" creates series; "refresh"
// rewrites the minute of existing ones. Reported per series.
func BenchmarkApplyTrack(b *testing.B) {
	for _, mode := range []string{"new", "refresh"} {
		b.Run(mode, func(b *testing.B) {
			f := newTestFSM(b, 0)
			r := rand.New(rand.NewPCG(1, 2))
			const per = 1000
			pool := make([][]byte, 256)
			hashes := make([][]uint64, len(pool))
			for i := range pool {
				hs := make([]uint64, per)
				for j := range hs {
					hs[j] = hashIn(r, f)
				}
				hashes[i] = hs
				pool[i] = AppendTrack(nil, 29_000_000, []TenantHashes{{Tenant: fmt.Sprintf("t%d", i%16), Hashes: hs}})
			}
			if mode == "refresh" {
				for i, d := range pool {
					f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: d})
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d := pool[i%len(pool)]
				if mode == "new" && i%len(pool) == 0 && i > 0 {
					b.StopTimer()
					f = newTestFSM(b, 0)
					b.StartTimer()
				}
				f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: d})
			}
			b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "series/s")
		})
	}
}

// BenchmarkLookup measures the leader's read of committed state for one
// 1,000-hash request of a tenant holding 1M series in the group.
func BenchmarkLookup(b *testing.B) {
	f := newTestFSM(b, 0)
	r := rand.New(rand.NewPCG(3, 4))
	all := make([]uint64, 1_000_000)
	for i := range all {
		all[i] = hashIn(r, f)
	}
	for i := 0; i < len(all); i += 10_000 {
		f.ApplyEntry(Entry{Type: EntryTrack, Now: 29_000_000, Tenants: []TenantHashes{{Tenant: "t", Hashes: all[i : i+10_000]}}})
	}
	req := make([][]uint64, 64)
	for i := range req {
		req[i] = make([]uint64, 1000)
		for j := range req[i] {
			req[i][j] = all[r.IntN(len(all))]
		}
	}
	out := make([]uint8, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Lookup("t", req[i%len(req)], 29_000_001, 20, out)
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "series/s")
}
