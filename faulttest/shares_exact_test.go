package faulttest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

// hashesInGroup returns n distinct pseudo-random hashes whose partitions all
// belong to group g (of the default layout).
func hashesInGroup(seed uint64, g, n int) []uint64 {
	r := rand.New(rand.NewPCG(seed, uint64(g)+17))
	seen := map[uint64]bool{}
	out := make([]uint64, 0, n)
	for len(out) < n {
		h := r.Uint64()
		if api.GroupOf(api.Partition(h, partitions), partitions, groups) != g || seen[h] {
			continue
		}
		seen[h] = true
		out = append(out, h)
	}
	return out
}

// activeSeries sums the tenant's active series over every group as the
// nodes' replicas report them (the largest count any node reports per group:
// counts only grow in these tests).
func activeSeries(c *cluster, tenant string) (total int64, perGroup []int64) {
	perGroup = make([]int64, groups)
	for _, n := range c.nodes {
		if v := tenantOn(n, tenant); v != nil {
			for g, a := range v.PerGroup {
				perGroup[g] = max(perGroup[g], a)
			}
		}
	}
	return sum(perGroup), perGroup
}

func trackAll(t *testing.T, cl *clientlib.Client, tenant string, hs []uint64) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rej, err := cl.TrackSeries(ctx, tenant, hs)
	if err != nil {
		t.Fatalf("track %d series of %s: %v", len(hs), tenant, err)
	}
	return rej
}

// TestOneRequestLargerThanAShare: with max_series=1000, one track of 1,000
// distinct series that all fall in group 0 (a quarter of the partitions, so a
// base share of 250) is accepted in full: group 0 borrows every series of
// headroom the other groups have, and nothing is refused below the limit.
// The 1,001st series is then refused, and counted at="limit".
func TestOneRequestLargerThanAShare(t *testing.T) {
	tenants := []string{"mv1", "mv2", "mv3"}
	opts := clusterOptions{defaultMaxSeries: 300, shareMode: "movable", tenantMaxSeries: map[string]int64{}}
	for _, tn := range tenants {
		opts.tenantMaxSeries[tn] = 1000
	}
	c := newCluster(t, opts)
	c.waitReplicas(1) // the limits file is the runtime config
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	before := c.shareMetrics()
	for i, tn := range tenants {
		hs := hashesInGroup(uint64(100+i), 0, 1000)
		t0 := time.Now()
		rej := trackAll(t, cl, tn, hs)
		t.Logf("%s: 1000 series in group 0: %d rejected, in %v", tn, len(rej), time.Since(t0).Round(time.Millisecond))
		if len(rej) != 0 {
			total, per := activeSeries(c, tn)
			t.Errorf("%s: %d of 1000 series in group 0 rejected below the limit (active %d, per group %v)", tn, len(rej), total, per)
			continue
		}
		extra := hashesInGroup(uint64(200+i), 0, 1)
		t0 = time.Now()
		rej = trackAll(t, cl, tn, extra)
		t.Logf("%s: the 1001st series: %d rejected, in %v", tn, len(rej), time.Since(t0).Round(time.Millisecond))
		if len(rej) != 1 {
			t.Errorf("%s: the 1001st series was accepted", tn)
		}
		t0 = time.Now()
		c.waitSettled(t, tn)
		t.Logf("%s: settled in %v", tn, time.Since(t0).Round(time.Millisecond))
		if total, per := activeSeries(c, tn); total != 1000 {
			t.Errorf("%s: %d active (per group %v), want 1000", tn, total, per)
		}
	}
	after := c.shareMetrics()
	atShare := after[`tollgate_share_rejections_total{at="share"}`] - before[`tollgate_share_rejections_total{at="share"}`]
	atLimit := after[`tollgate_share_rejections_total{at="limit"}`] - before[`tollgate_share_rejections_total{at="limit"}`]
	t.Logf("rejections counted: at=share %v, at=limit %v", atShare, atLimit)
	if !t.Failed() && (atShare != 0 || atLimit != float64(len(tenants))) {
		t.Errorf("rejections counted at=share %v at=limit %v, want 0 and %d (one per tenant, at its limit)", atShare, atLimit, len(tenants))
	}
}

// TestLoweredLimitNeverExceeded: max_series=4000, 2,000 series into group 0
// (it borrows from the others), then max_series=2000: the groups that lent
// their headroom away, and the one that did not, admit nothing new while the
// tenant holds 2,000; the tenant never exceeds the new limit.
func TestLoweredLimitNeverExceeded(t *testing.T) {
	const tn = "lower"
	c := newCluster(t, clusterOptions{defaultMaxSeries: 300, shareMode: "movable", tenantMaxSeries: map[string]int64{tn: 4000}})
	c.waitReplicas(1) // the limits file is the runtime config
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if rej := trackAll(t, cl, tn, hashesInGroup(1, 0, 2000)); len(rej) != 0 {
		t.Fatalf("%d of 2000 series rejected below the limit of 4000", len(rej))
	}
	c.waitSettled(t, tn)
	c.setLimits(c.nodes[2], &api.SetLimitsRequest{Tenant: tn, Set: map[string]string{"max_series": "2000"}})
	c.waitReplicas(2)
	accepted := 0
	for g := 1; g < groups; g++ {
		hs := hashesInGroup(uint64(10+g), g, 200)
		rej := trackAll(t, cl, tn, hs)
		accepted += len(hs) - len(rej)
	}
	total, per := activeSeries(c, tn)
	t.Logf("after lowering 4000 → 2000 with 2000 held: %d of 600 new accepted; active %d %v", accepted, total, per)
	if accepted != 0 || total > 2000 {
		t.Fatalf("tenant exceeds its lowered limit: %d new accepted, %d active (per group %v), limit 2000", accepted, total, per)
	}
	// Going back below the limit is not needed for this bar; a raise takes
	// effect at once.
	c.setLimits(c.nodes[0], &api.SetLimitsRequest{Tenant: tn, Set: map[string]string{"max_series": "2600"}})
	c.waitReplicas(3)
	accepted = 0
	for g := 1; g < groups; g++ {
		hs := hashesInGroup(uint64(20+g), g, 200)
		accepted += len(hs) - len(trackAll(t, cl, tn, hs))
	}
	if total, per := activeSeries(c, tn); accepted != 600 || total != 2600 {
		t.Fatalf("after raising to 2600: %d of 600 new accepted, %d active (per group %v)", accepted, total, per)
	}
}
