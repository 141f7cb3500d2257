package faulttest

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/forward"
)

// localLimits asks n for the runtime config it holds itself: the forwarded
// mark makes it answer from its own replicas instead of asking group 0's
// leader, so group_versions are n's replicas.
func (c *cluster) localLimits(n *node) (*api.GetLimitsResponse, error) {
	ctx, cancel := adminCtx(context.Background(), adminCallTO)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, forward.Header, "1")
	return api.NewConfigClient(c.conn(n.grpcAddr)).GetLimits(ctx, &api.GetLimitsRequest{})
}

// waitReplicas waits until every usable node holds version v in every group
// and returns what the last node answered.
func (c *cluster) waitReplicas(v uint64) *api.GetLimitsResponse {
	c.t.Helper()
	deadline := time.Now().Add(progressTimeout)
	for {
		var last *api.GetLimitsResponse
		ok := true
		for _, n := range c.nodes {
			if !n.usable() {
				continue
			}
			r, err := c.localLimits(n)
			if err != nil {
				ok = false
				break
			}
			for _, gv := range r.GroupVersions {
				ok = ok && gv == v
			}
			if r.Version != v {
				// Not there yet (the reconciler is still copying): nothing
				// to compare.
				ok = false
				continue
			}
			if last != nil && !proto.Equal(last.Config, r.Config) {
				c.t.Fatalf("two nodes hold version %d with different documents:\n%v\n%v", v, last.Config, r.Config)
			}
			last = r
		}
		if ok && last != nil {
			return last
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replicas did not all reach config version %d (last answer %v)", v, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) setLimits(via *node, req *api.SetLimitsRequest) *api.LimitsChangeResponse {
	c.t.Helper()
	deadline := time.Now().Add(progressTimeout)
	for {
		ctx, cancel := adminCtx(context.Background(), 10*time.Second)
		resp, err := api.NewConfigClient(c.conn(via.grpcAddr)).SetLimits(ctx, req)
		cancel()
		if err == nil {
			return resp
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			c.t.Fatalf("set limits via %s: %v", via, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConfigSurvivesLeaderKill: a runtime config change made through a
// follower reaches every group's replica on every node and a clientlib
// client; SIGKILL of group 0's leader (the orderer) loses nothing — the
// survivors and then the restarted node hold the same version and document —
// and the next change continues the versions and reaches the client.
func TestConfigSurvivesLeaderKill(t *testing.T) {
	c := newCluster(t, defaultClusterOptions())
	// The nodes' limits file is proposed as version 1.
	c.waitReplicas(1)

	leader := c.waitLeader(0, nil)
	var via *node
	for _, n := range c.nodes {
		if n != leader {
			via = n
			break
		}
	}
	resp := c.setLimits(via, &api.SetLimitsRequest{Tenant: "t-mid", Set: map[string]string{
		"ingestion_rate": "1500", "ingestion_burst": "3000", "max_series_per_partition": "900", "sample_rates.locate": "30"}})
	if !resp.Changed || resp.Version != 2 {
		t.Fatalf("set: %+v", resp)
	}
	c.setLimits(via, &api.SetLimitsRequest{Global: true, Set: map[string]string{"sample_rates.locate": "60"}})
	before := c.waitReplicas(3)

	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitUntil(t, "client at config version 3", func() bool { return cl.RuntimeConfig().Version() == 3 })
	if rate, burst := cl.RuntimeConfig().IngestionRate("t-mid"); rate != 1500 || burst != 3000 {
		t.Fatalf("client sees t-mid rate %v burst %d", rate, burst)
	}

	leader.kill(t)
	newLeader := c.waitLeader(0, leader)
	after := c.waitReplicas(3)
	if !proto.Equal(before.Config, after.Config) {
		t.Fatalf("config changed across the kill:\n%v\n%v", before.Config, after.Config)
	}

	// The killed node comes back with the same version; the new orderer
	// continues the versions. (Changes wait for the restart: a proposal
	// needs every voter to advertise cluster version 3, and a dead node's is
	// unknown once serf marks it failed.)
	leader.restart(t)
	c.waitHealthy()
	c.waitReplicas(3)
	resp = c.setLimits(newLeader, &api.SetLimitsRequest{Tenant: "t-mid", Set: map[string]string{"ingestion_rate": "2500"}})
	if resp.Version != 4 {
		t.Fatalf("first change after the failover made version %d, want 4", resp.Version)
	}
	waitUntil(t, "client at config version 4", func() bool { return cl.RuntimeConfig().Version() == 4 })
	if rate, _ := cl.RuntimeConfig().IngestionRate("t-mid"); rate != 2500 {
		t.Fatalf("client sees t-mid rate %v after the failover", rate)
	}

	final := c.waitReplicas(4) // the restarted node too
	if r, _ := cl.RuntimeConfig().IngestionRate("t-mid"); r != 2500 || final.Config.Tenants["t-mid"].GetIngestionRate() != 2500 {
		t.Fatalf("final config %v", final.Config)
	}
	c.checkNoCrashes()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(progressTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConfigPropagation measures how long a runtime config change takes to
// reach clients: per round, a `set` through a random node, then the time
// until each of 10 clientlib clients (each watching whichever node it picked)
// has the new version, taken in the clients' own subscription callbacks. It
// reports the median and maximum over all client arrivals; the bar (≤ 1 s
// median) is reported, not asserted (the machine is shared).
//
//	TOLLGATE_CONFIG_ROUNDS=50 go test -count=1 -run TestConfigPropagation -v ./faulttest/
func TestConfigPropagation(t *testing.T) {
	rounds := 5
	if v := os.Getenv("TOLLGATE_CONFIG_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TOLLGATE_CONFIG_ROUNDS=%q: want a positive integer", v)
		}
		rounds = n
	}
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1000})
	const clients = 10
	type arrival struct {
		client  int
		version uint64
		at      time.Time
	}
	arrivals := make(chan arrival, clients*(rounds+2))
	for i := range clients {
		// Each client starts from another node, so streams spread over them.
		addrs := c.grpcAddrs()
		addrs = append(addrs[i%3:], addrs[:i%3]...)
		cl, err := clientlib.New(clientlib.Config{Addrs: addrs, Token: adminToken})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		defer cl.OnRuntimeConfig(func(r *clientlib.RuntimeConfig) { arrivals <- arrival{i, r.Version(), time.Now()} })()
	}
	var lat, commit []time.Duration
	for round := 1; round <= rounds; round++ {
		via := c.nodes[rand.IntN(len(c.nodes))]
		start := time.Now()
		resp := c.setLimits(via, &api.SetLimitsRequest{Tenant: "t-prop", Set: map[string]string{"ingestion_rate": strconv.Itoa(round * 10)}})
		// Baseline: the set's own reply (committed in group 0, installed in
		// the other groups).
		commit = append(commit, time.Since(start))
		got := map[int]bool{}
		for len(got) < clients {
			select {
			case a := <-arrivals:
				if a.version == resp.Version && !got[a.client] {
					got[a.client] = true
					lat = append(lat, a.at.Sub(start))
				}
			case <-time.After(progressTimeout):
				t.Fatalf("round %d: %d of %d clients got version %d", round, len(got), clients, resp.Version)
			}
		}
	}
	slices.Sort(lat)
	slices.Sort(commit)
	t.Logf("baseline, set reply (group 0 commit + install in every group): median %v, max %v",
		commit[len(commit)/2].Round(time.Millisecond), commit[len(commit)-1].Round(time.Millisecond))
	t.Logf("config change → all %d clients, %d rounds (%d arrivals): median %v, p90 %v, max %v",
		clients, rounds, len(lat), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}
