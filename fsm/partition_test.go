package fsm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"
)

// fillGroup tracks n series of 10 tenants, spread over the group's
// partitions, into f.
func fillGroup(t testing.TB, f *FSM, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	const per = 1000
	for i := 0; i*per < n; i++ {
		hs := make([]uint64, per)
		for j := range hs {
			hs[j] = hashIn(r, f)
		}
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand,
			Data: AppendTrack(nil, 29_000_000, []TenantHashes{{Tenant: fmt.Sprintf("t%d", i%10), Hashes: hs, New: per}})})
	}
}

// TakePartition removes exactly the partition's series (counts per tenant
// and in total), keeps every other series findable, and PutPartition puts
// them back with their minutes.
func TestTakeAndPutPartition(t *testing.T) {
	f := newTestFSM(t, 0)
	fillGroup(t, f, 20_000)
	lo, _ := f.PartitionRange()
	before := f.Stats().Series
	_, taken := f.TakePartition(lo)
	var n int64
	for _, ps := range taken {
		n += int64(len(ps.Hashes))
		out := make([]uint8, len(ps.Hashes))
		f.Lookup(ps.Tenant, ps.Hashes, 29_000_000, 21, out)
		for _, st := range out {
			if st != StateAbsent {
				t.Fatal("a taken series is still found")
			}
		}
	}
	if n == 0 || f.Stats().Series != before-n {
		t.Fatalf("took %d series; %d → %d active", n, before, f.Stats().Series)
	}
	g := newTestFSM(t, 1)
	g.PutPartition(29_000_000, taken)
	if g.Stats().Series != n || g.Now() != 29_000_000 {
		t.Fatalf("put %d series: %d active, now %d", n, g.Stats().Series, g.Now())
	}
	for _, ps := range taken {
		out := make([]uint8, len(ps.Hashes))
		g.Lookup(ps.Tenant, ps.Hashes, 29_000_000, 21, out)
		for _, st := range out {
			if st != StateFresh {
				t.Fatalf("a put series reads %d, want fresh (its minute kept)", st)
			}
		}
	}
}

// BenchmarkTakePartition is the give's cost on the apply goroutine: one
// partition out of a group of 500,000 series (10 tenants, each with series
// in every partition of the group, so every table is rebuilt). Reported per
// give and per series of the group.
func BenchmarkTakePartition(b *testing.B) {
	const groupSeries = 500_000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := newTestFSM(b, 0)
		fillGroup(b, f, groupSeries)
		lo, _ := f.PartitionRange()
		b.StartTimer()
		f.TakePartition(lo)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/groupSeries, "ns/group-series")
}
