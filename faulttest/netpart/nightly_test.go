package netpart

import (
	"github.com/tollgate-io/tollgate/faulttest/checker"

	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNightlyPartitions is the partition half of the nightly run
// (faulttest.TestNightly has the process, disk, clock and membership
// faults): one docker cluster under the checker's load for
// TOLLGATE_NIGHTLY (e.g. 30m), one network fault after another, drawn at
// random:
//
//   - isolate: a random node (whatever it leads) loses its peers network
//     for 2–6 s; it keeps answering clients and must acknowledge nothing
//     new meanwhile (the checker forbids it);
//   - zone: a random node loses both networks for 2–6 s, as when a zone's
//     uplink fails;
//   - flap: a random node's peer link goes down and up 4–8 times, 0.3–2 s
//     each way, acknowledging nothing while down.
//
// After each fault the cluster must be healthy again (every group led, 3
// voters) and every group must take writes; at the end the sweep re-sends
// every acknowledged series and the whole history is checked. The nodes
// run a 60-minute idle timeout (histories do not model expiry), so the
// run is held to 50 minutes.
//
//	TOLLGATE_NIGHTLY=30m go test -count=1 -timeout 60m -run '^TestNightlyPartitions$' -v ./faulttest/netpart/
//
// TOLLGATE_NIGHTLY_SEED replays a run's sequence (the seed is logged).
// Skipped without TOLLGATE_NIGHTLY or without docker.
func TestNightlyPartitions(t *testing.T) {
	length, seed, rng := checker.Nightly(t, "the nightly-style random partition run")

	c := newClusterIdle(t, "60m")
	ck := startChecker(t, c, checkerConfig())
	ck.WaitProgress("start")
	loadFor(2 * time.Second)

	hold := func() time.Duration { return 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second))) }
	kinds := []struct {
		name string
		run  func() string
	}{
		{"isolate", func() string {
			n := c.nodes[rng.IntN(len(c.nodes))]
			led := leads(c.nodeGroups()[n])
			d := hold()
			cutAt := c.isolate(n)
			lift := ck.ForbidAcks(n.grpcAdv, cutAt, "it was cut off from its peers")
			time.Sleep(d)
			c.rejoin(n)
			lift()
			return fmt.Sprintf("%s (leading groups %v) off its peers for %v", n.id, led, d.Round(time.Millisecond))
		}},
		{"zone", func() string {
			n := c.nodes[rng.IntN(len(c.nodes))]
			led := leads(c.nodeGroups()[n])
			d := hold()
			c.cutZone(n)
			time.Sleep(d)
			c.healZone(n)
			return fmt.Sprintf("%s (%s, leading groups %v) cut off for %v", n.zone, n.id, led, d.Round(time.Millisecond))
		}},
		{"flap", func() string {
			n := c.nodes[rng.IntN(len(c.nodes))]
			flaps := 4 + rng.IntN(5)
			for i := range flaps {
				cutAt := c.isolate(n)
				lift := ck.ForbidAcks(n.grpcAdv, cutAt, fmt.Sprintf("flap %d cut it off", i+1))
				time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(1700*time.Millisecond))))
				c.rejoin(n)
				lift()
				time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(1700*time.Millisecond))))
			}
			return fmt.Sprintf("%s's peer link flapped %d times", n.id, flaps)
		}},
	}

	start := time.Now()
	counts := map[string]int{}
	var heals []time.Duration
	for round := 1; time.Since(start) < length; round++ {
		k := kinds[rng.IntN(len(kinds))]
		what := k.run()
		healthy := c.waitHealthy()
		ck.WaitProgress(k.name + " done")
		counts[k.name]++
		heals = append(heals, healthy)
		t.Logf("nightly partition %d at %v: %s: %s; healthy %.2f s after the heal", round, time.Since(start).Round(time.Second), k.name, what, healthy.Seconds())
		loadFor(time.Second + time.Duration(rng.Int64N(int64(3*time.Second))))
	}
	checkStart := time.Now()
	ck.finish()
	var names []string
	for name, n := range counts {
		names = append(names, fmt.Sprintf("%s %d", name, n))
	}
	slices.Sort(names)
	t.Logf("nightly partitions: %v, seed %d, faults: %s; healthy after a heal: median %s, max %s; finish (sweep, report, history check) %v",
		time.Since(start).Round(time.Second), seed, strings.Join(names, ", "), fmtDur(median(heals)), fmtDur(slices.Max(heals)), time.Since(checkStart).Round(time.Millisecond))
}
