package admission

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkDecidePending: Decide as a busy leader runs it, with entries in
// flight: 16 tenants, batches of 8 requests of 1,000 new series each, three
// batches in flight (each completes, in log order, three batches after it
// was decided). The in-process admission benchmark has one batch in flight
// at a time, so its pending sets stay tiny and cached; this is the leader's
// cost of the in-flight sets themselves.
func BenchmarkDecidePending(b *testing.B) {
	const tenants, perReq, reqs, inFlight = 16, 1000, 8, 3
	r := rand.New(rand.NewPCG(1, 2))
	s := newSession(&Tracker{}, nil)
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprint("tenant-", i)
	}
	states := make([]uint8, perReq) // all absent: new series
	in := make([]Request, reqs)
	for i := range in {
		in[i] = Request{Tenant: names[i%tenants], Hashes: make([]uint64, perReq), States: states}
	}
	var ring []*batch
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for i := range in {
			in[i].Tenant = names[r.IntN(tenants)]
			for j := range in[i].Hashes {
				in[i].Hashes[j] = r.Uint64()
			}
		}
		ring = append(ring, benchDecide(s, in))
		if len(ring) > inFlight {
			s.clearPending(ring[0])
			ring = ring[1:]
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*reqs*perReq), "ns/series")
}
