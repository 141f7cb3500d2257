package faulttest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tollgate-io/tollgate/clientlib"
)

// TestSummariesSurviveKill: a clientlib client (ModeAuto) learns near-limit
// crossings from WatchSummaries. Twice, the node serving its stream for group
// 0 is SIGKILLed (the second time after the first victim was restarted and
// the stream had moved elsewhere); each time a tenant that crosses the
// near-limit fraction afterwards must reach the client through another node,
// and the tenants that crossed before must still be listed (the new node
// sends its full set on subscribe). No timing is asserted: the bounds only
// turn a hang into a failure.
//
//	go test -count=1 -run TestSummariesSurviveKill -v ./faulttest/
func TestSummariesSurviveKill(t *testing.T) {
	// 400 series per tenant over 4 groups: a share of 100 per group, so 86
	// series in partition 0 (group 0) cross the default fraction 0.85.
	c := newCluster(t, clusterOptions{defaultMaxSeries: 400})
	const grp, part = 0, 0
	watcher, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken, Mode: clientlib.ModeAuto})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	waitUntil(t, "the client to receive group 0's summary", func() bool {
		v := watcher.NearLimit(grp)
		return v.Known && v.From != ""
	})
	listed := func(tenants ...string) bool {
		v := watcher.NearLimit(grp)
		for _, tn := range tenants {
			if !slices.Contains(v.Tenants, tn) {
				return false
			}
		}
		return true
	}
	crossed := []string{}
	cross := func(tenant string) {
		t.Helper()
		if listed(tenant) {
			t.Fatalf("%s listed near its limit before it crossed", tenant)
		}
		trackUntilOK(t, c, tenant, part, hashesOf(part, 86))
		crossed = append(crossed, tenant)
		waitUntil(t, tenant+" in the client's near-limit list", func() bool { return listed(crossed...) })
	}
	byID := func(id string) *node {
		for _, n := range c.nodes {
			if n.id == id {
				return n
			}
		}
		t.Fatalf("summary served by unknown node %q", id)
		return nil
	}

	cross("near-0")
	for round := 1; round <= 2; round++ {
		if round == 2 {
			// The first victim comes back; the stream stays where it moved.
			c.waitHealthy()
		}
		victim := byID(watcher.NearLimit(grp).From)
		breaks := watcher.Stats().SummaryStreamBreaks
		t.Logf("round %d: group %d's summaries come from %s (leaders: %s); SIGKILL it", round, grp, victim.id, c.describe())
		victim.kill(t)
		tenant := fmt.Sprintf("near-%d", round)
		cross(tenant)
		v := watcher.NearLimit(grp)
		if v.From == victim.id {
			t.Fatalf("round %d: %s listed by %s, which is dead", round, tenant, victim.id)
		}
		t.Logf("round %d: %v listed, now served by %s at applied index %d; stream breaks %d → %d",
			round, v.Tenants, v.From, v.AppliedIndex, breaks, watcher.Stats().SummaryStreamBreaks)
		if st := watcher.Stats(); st.SummaryPolling {
			t.Fatalf("round %d: the client fell back to polling", round)
		}
		victim.restart(t)
	}
	c.waitHealthy()
	c.checkNoCrashes()
}
