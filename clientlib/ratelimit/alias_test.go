package ratelimit_test

import (
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
)

// The re-exported names decide like the core they alias: admit before any
// update, then exactly up to the lease cap an owner grants.
func TestReexportDecides(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, err := ratelimit.NewLimiter(ratelimit.LimiterConfig{Strategy: ratelimit.Lease, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Allow("acme", 5) {
		t.Fatal("no update yet: must admit")
	}
	l.Tick(now)
	rep := l.Report(ratelimit.NewReportState(), nil)
	if len(rep.NewNames) != 1 || rep.NewNames[0] != "acme" || rep.ConsumedTotal[0] != 5 {
		t.Fatalf("report %+v", rep)
	}
	u := &api.RateUpdate{ActiveClients: 1, Ids: rep.Ids, Limit: []float64{10}, Burst: []uint64{10}, WindowNanos: []int64{int64(time.Second)},
		Cap: []uint64{8}, LeaseRate: []float64{10}}
	if _, err := l.Apply(u, now); err != nil {
		t.Fatal(err)
	}
	h := l.Tenant("acme")
	if !h.Allow(3) || h.Allow(1) {
		t.Fatal("cap 8 after 5 consumed: 3 more admitted, then none")
	}
	if s, err := ratelimit.ParseStrategy("blocklist"); err != nil || s != ratelimit.Blocklist {
		t.Fatalf("ParseStrategy: %v %v", s, err)
	}
}
