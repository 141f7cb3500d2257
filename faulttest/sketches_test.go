package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
)

// metricValue reads one unlabelled sample from n's /metrics (-1: unreadable).
func metricValue(n *node, name string) float64 {
	body, code, err := httpGet("http://" + httpAddr(n) + "/metrics")
	if err != nil || code != 200 {
		return -1
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

func envRounds(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// TestSketchConvergenceKill measures the the product rules convergence bar on real
// `tollgate server` processes: 10 partitionlimit clients pushing every second
// to a 3-node cluster; per round each client adds 1,000 new series to one
// partition, and the time until each client's window registers equal the
// union of every client's is recorded. Then, in the middle of a round — every
// client has just pushed (Flush) to its node — the node serving the most
// WatchSketches streams is SIGKILLed, before it can pass those pushes on to
// its peers (every 200 ms); that round and the following ones must still
// converge through the two survivors. The limits come from the replicated
// runtime config (`max_series_per_partition`, set through the Config
// service) via a clientlib.Client handed to the limiters as their Limits.
//
// Asserted: every round converges (the bound only turns a hang into a
// failure), no client reports the remote unreachable, and clients whose node
// died resent their state. Medians and maxima are logged, not asserted.
//
//	TOLLGATE_SKETCH_ROUNDS=10 go test -count=1 -run TestSketchConvergenceKill -v ./faulttest/
func TestSketchConvergenceKill(t *testing.T) {
	rounds := envRounds(t, "TOLLGATE_SKETCH_ROUNDS", 5)
	const clients, tenant, partition = 10, "t-sketch", int32(5)
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1000})
	resp := c.setLimits(c.nodes[1], &api.SetLimitsRequest{Tenant: tenant, Set: map[string]string{"max_series_per_partition": "1000000000000"}})
	c.waitReplicas(resp.Version)

	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitUntil(t, "the client to hold the tenant's partition limit", func() bool { return cl.MaxSeriesPerPartition(tenant) > 0 })

	lims := make([]*partitionlimit.Limiter, clients)
	for i := range lims {
		l, err := partitionlimit.New(partitionlimit.Config{Addrs: c.grpcAddrs(), Token: adminToken, PushInterval: time.Second,
			RPCTimeout: 500 * time.Millisecond, ReconnectMax: 200 * time.Millisecond, Limits: cl})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		lims[i] = l
	}
	waitUntil(t, "every limiter connected", func() bool {
		for _, l := range lims {
			if l.Stats().BatchesReceived == 0 {
				return false
			}
		}
		return true
	})

	r := rand.New(rand.NewPCG(11, 11))
	addSeries := func() {
		for _, l := range lims {
			hs := make([]uint64, 1000)
			for k := range hs {
				hs[k] = r.Uint64()
			}
			if err := l.Check(tenant, []partitionlimit.Series{{Partition: partition, Hashes: hs}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// converge waits until every client's window equals the union of all
	// clients' and returns each client's time since t0.
	converge := func(what string, t0 time.Time) []time.Duration {
		target := make([]uint8, 1<<api.DefaultHLLPrecision)
		for _, l := range lims {
			for i, v := range l.WindowRegisters(tenant, partition) {
				target[i] = max(target[i], v)
			}
		}
		done := make([]time.Duration, clients)
		for left := clients; left > 0; {
			if time.Since(t0) > progressTimeout {
				var st []string
				for i, l := range lims {
					if done[i] == 0 {
						s := l.Stats()
						st = append(st, fmt.Sprintf("client %d: remote %s, pushes %d, failures %d, resends %d, reconnects %d", i, s.Remote, s.Pushes, s.PushFailures, s.Resends, s.WatchReconnects))
					}
				}
				t.Fatalf("%s: %d clients did not converge within %v:\n%s", what, left, progressTimeout, strings.Join(st, "\n"))
			}
			for i, l := range lims {
				if done[i] == 0 && slices.Equal(l.WindowRegisters(tenant, partition), target) {
					done[i] = time.Since(t0)
					left--
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		return done
	}
	report := func(name string, lat []time.Duration) {
		s := slices.Clone(lat)
		slices.Sort(s)
		t.Logf("%s: %d samples, median %v, max %v", name, len(s), median(s).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
	}

	var before, killRound, after []time.Duration
	for round := range rounds {
		addSeries()
		before = append(before, converge(fmt.Sprintf("round %d", round), time.Now())...)
	}

	// The victim: the node most clients watch (and push to).
	var victim *node
	best := -1.0
	subs := map[string]float64{}
	for _, n := range c.nodes {
		v := metricValue(n, "tollgate_sketch_subscribers")
		subs[n.id] = v
		if v > best {
			victim, best = n, v
		}
	}
	t.Logf("WatchSketches streams per node %v: SIGKILL %s", subs, victim.id)
	addSeries()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	for _, l := range lims {
		if err := l.Flush(ctx); err != nil {
			t.Fatalf("flush before the kill: %v", err)
		}
	}
	cancel()
	victim.kill(t)
	killRound = converge("kill round", t0)
	for round := range rounds {
		addSeries()
		after = append(after, converge(fmt.Sprintf("round %d after the kill", round), time.Now())...)
	}

	report("3 nodes", before)
	report("round of the SIGKILL (from the clients' pushes, kill right after)", killRound)
	report("after the SIGKILL (2 nodes)", after)
	resent := 0
	for i, l := range lims {
		s := l.Stats()
		if s.Remote == partitionlimit.RemoteUnreachable {
			t.Errorf("client %d reports the remote unreachable with two nodes up", i)
		}
		if s.Resends > 0 {
			resent++
		}
	}
	t.Logf("%d of %d clients resent their sketches after the kill", resent, clients)
	if best > 0 && resent == 0 {
		t.Errorf("%s served %v streams, yet no client resent its state after the kill", victim.id, best)
	}
	c.checkNoCrashes()
}
