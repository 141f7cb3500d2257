package faulttest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

// logSince returns n's log lines (stderr) stamped at or after since that
// contain any of subs (text log format: time=RFC3339 first).
func logSince(t *testing.T, n *node, since time.Time, subs ...string) []string {
	t.Helper()
	data, err := os.ReadFile(n.errPath)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		ts, _, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil || at.Before(since) {
			continue
		}
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// TestFailoverThroughClientlib measures what a distributor sees of a leader
// kill: under clientlib load (8 workers), group 0's leader is SIGKILLed;
// right after the kill one TrackPartition call to a partition of group 0 is
// made by another client (FailOpen off: it retries inside clientlib until it
// succeeds, within a 10 s deadline), and kill → its success is the failover. The killed node
// is restarted and the cluster healthy again before the next kill.
// TOLLGATE_FAILOVER_KILLS (default 3; the bar is 20) kills,
// TOLLGATE_CPU_HOG (default 0; the bar is load near 8, about 6 on 2 cores)
// spinning processes beside the cluster. Median and max are logged with the
// load average, not asserted; every probe call must succeed.
//
//	TOLLGATE_FAILOVER_KILLS=20 TOLLGATE_CPU_HOG=6 go test -count=1 -run TestFailoverThroughClientlib -v ./faulttest/
func TestFailoverThroughClientlib(t *testing.T) {
	kills, hog := 3, 0
	for name, dst := range map[string]*int{"TOLLGATE_FAILOVER_KILLS": &kills, "TOLLGATE_CPU_HOG": &hog} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a count", name, v)
			}
			*dst = n
		}
	}
	const g = 0
	c := newCluster(t, clusterOptions{defaultMaxSeries: 0})
	load := startClientLoad(t, c, 8)
	defer load.close()
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken, Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := cl.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	cpuHog(t, hog)
	lo, _ := api.GroupRange(g, partitions, groups)
	var seq atomic.Uint64
	probe := func() error {
		first, _ := api.PartitionHashRange(lo, partitions)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cl.TrackPartition(ctx, "failover", lo, []uint64{first + seq.Add(1)})
		return err
	}
	var took, electedIn []time.Duration
	var killed []time.Time
	for round := 1; round <= kills; round++ {
		loadFor(time.Second)
		l := c.waitLeader(g, nil)
		st0 := cl.Stats()
		killAt := time.Now()
		killed = append(killed, killAt)
		l.kill(t)
		err := probe()
		d := time.Since(killAt)
		st1 := cl.Stats()
		if err != nil {
			t.Errorf("kill %d (%s): the call after the kill failed after %v: %v", round, l.id, d.Round(time.Millisecond), err)
		} else {
			took = append(took, d)
		}
		// Kill → a survivor's raft reports leadership of g: the server's
		// part of the failover (the rest is the client finding it).
		elected, best := "not seen", time.Duration(-1)
		for _, n := range c.nodes {
			if n == l {
				continue
			}
			lines := logSince(t, n, killAt, fmt.Sprintf(`msg="raftnode: leadership changed" group=%d leader=true`, g))
			if len(lines) == 0 {
				continue
			}
			ts, _, _ := strings.Cut(strings.TrimPrefix(lines[0], "time="), " ")
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && (best < 0 || at.Sub(killAt) < best) {
				best = at.Sub(killAt)
				elected = fmt.Sprintf("%v (%s)", best.Round(time.Millisecond), n.id)
			}
		}
		if best >= 0 {
			electedIn = append(electedIn, best)
		}
		t.Logf("kill %d/%d: %s → next success through clientlib after %v (%d retries, %d leader wakes); raft leader of group %d after %s",
			round, kills, l.id, d.Round(time.Millisecond), st1.Retries-st0.Retries, st1.LeaderWakes-st0.LeaderWakes, g, elected)
		if d > 2*time.Second {
			// What the survivors' logs say of the elections in between.
			for _, n := range c.nodes {
				if n != l {
					for _, line := range logSince(t, n, killAt, "heartbeat timeout", "election", "leadership changed", "lost leadership") {
						t.Logf("  %s: %s", n.id, line)
					}
				}
			}
		}
		l.restart(t)
		c.waitHealthy()
	}
	loadavg, _ := os.ReadFile("/proc/loadavg")
	if len(took) > 0 {
		slices.Sort(took)
		t.Logf("%d kills beside %d spinning processes: kill → next success through clientlib median %v, max %v; load average %s",
			len(took), hog, took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), strings.TrimSpace(string(loadavg)))
	}
	if len(electedIn) > 0 {
		slices.Sort(electedIn)
		t.Logf("kill → raft leader of group %d (first survivor log line), %d kills: median %v, max %v",
			g, len(electedIn), electedIn[len(electedIn)/2].Round(time.Millisecond), electedIn[len(electedIn)-1].Round(time.Millisecond))
	}
	// The bar: the 8 writers (FailOpen on) see errors and fail-open
	// decisions only within 2 s of a kill.
	load.mu.Lock()
	nFail := len(load.failures)
	load.mu.Unlock()
	outside := load.failuresOutside(killed, 2*time.Second)
	t.Logf("load: %d requests, %d errors or fail-open decisions, %d of them more than 2 s after a kill", load.requests.Load(), nFail, len(outside))
	for i, f := range outside {
		if i == 5 {
			break
		}
		t.Errorf("a writer saw a failure at %s, not within 2 s of a kill: %s", f.at.Format("15:04:05.000"), f.what)
	}
	c.checkNoCrashes()
}
