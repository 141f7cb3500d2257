package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

func startRateCluster(t *testing.T, limitsYAML string) *servertest.Cluster {
	t.Helper()
	return startSkewedRateCluster(t, limitsYAML, [3]time.Duration{})
}

// startSkewedCluster starts 3 nodes whose wall clocks are shifted by skew
// (the test-only clock offset: monotonic time, timers and raft untouched).
func startSkewedRateCluster(t *testing.T, limitsYAML string, skew [3]time.Duration) *servertest.Cluster {
	t.Helper()
	lf := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(lf, []byte(limitsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Nodes: 3, Configure: func(i int, cfg *server.Config) {
		cfg.Limits.File, cfg.Clock.TestOffset = lf, skew[i]
	}})
}

// TestOwnerFailover runs Lease clients at 2× a tenant's limit against a real
// 3-node cluster, stops the node that owns the tenant's rate state, and checks
// that the clients move to the new owner and that admitted traffic stays
// bounded: the new owner rebuilds the window from the clients' counts and
// the clients keep their last lease rate meanwhile, so there is no fresh
// burst from a window reset to zero.
func TestOwnerFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	t.Run("graceful", func(t *testing.T) { testOwnerFailover(t, false, false) })
	// abrupt: Stop with an expired context skips the leadership hand-off and
	// closes the node's streams at once (Unavailable) while the cluster view
	// still names it as the group's leader until an election: the clients
	// must re-route on the stream error, not wait for the view.
	t.Run("abrupt", func(t *testing.T) { testOwnerFailover(t, true, false) })
}

// TestOwnerFailoverSkewedClocks is TestOwnerFailover with wrong wall clocks:
// the nodes' within the cluster's bound (0, +400 ms, −400 ms) and the
// clients' far beyond it (+5 min, −5 min, +30 min …: distributors are not
// cluster members, nothing bounds their clocks). Owners and clients each
// measure time on their own clock and exchange durations (blocked-for, lease
// grants, bucket ages), so the limit holds as with correct clocks: ≈ the
// limit before, the same bound across the failover (docs/clocks.md).
func TestOwnerFailoverSkewedClocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	testOwnerFailover(t, false, true)
}

func testOwnerFailover(t *testing.T, abrupt, skewed bool) {
	const limit = 2000.0
	var nodeSkew [3]time.Duration
	clientSkew := make([]time.Duration, 5)
	if skewed {
		nodeSkew = [3]time.Duration{0, 400 * time.Millisecond, -400 * time.Millisecond}
		clientSkew = []time.Duration{5 * time.Minute, -5 * time.Minute, 30 * time.Minute, -30 * time.Minute, 0}
	}
	cl := startSkewedRateCluster(t, fmt.Sprintf("defaults:\n  ingestion_rate: %g\n", limit), nodeSkew)
	addrs := cl.GRPCAddrs()
	var clients []*ratelimit.Client
	for i := range 5 {
		skew := clientSkew[i]
		c, err := ratelimit.New(ratelimit.Config{Addrs: addrs, Strategy: ratelimit.Lease, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Now: func() time.Time { return time.Now().Add(skew) }})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	const tenant = "failover-tenant"
	g := api.RateGroup(tenant, api.DefaultPartitions, api.DefaultGroups)
	owner := cl.LeaderIndex(g)
	if owner < 0 {
		t.Fatal("no leader for the tenant's rate group")
	}
	// Offer 2× the limit in 10-token requests, round-robin over the clients.
	// The offer follows elapsed time, not a count of sleeps: on a loaded
	// machine a 10 ms sleep takes longer, and a per-step quota would then
	// offer less than the limit and measure the generator, not the limiter.
	offer := func(d time.Duration) (admitted float64) {
		start := time.Now()
		end := start.Add(d)
		offered := 0
		for now := start; now.Before(end); now = time.Now() {
			for due := int(2 * limit * now.Sub(start).Seconds() / 10); offered < due; offered++ {
				if clients[offered%len(clients)].Allow(tenant, 10) {
					admitted += 10
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		return admitted
	}
	offer(2 * time.Second) // warm-up: leases in place
	before := offer(2 * time.Second)
	// Above the limit is the fault; below it, on a machine running the
	// race detector and two suites at once, the leases renew late (2,540
	// of 4,000 seen there): the floor only catches a limiter that admits
	// next to nothing, as after the failover below.
	if before > 1.2*limit*2 || before < 0.5*limit*2 {
		t.Fatalf("before failover: admitted %.0f tokens in 2s at 2× offered, want ≈ %.0f", before, 2*limit)
	}
	upd0 := clients[0].Stats().UpdatesReceived
	stopped := make(chan error, 1)
	go func() {
		ctx := context.Background()
		if abrupt {
			c, cancel := context.WithCancel(ctx)
			cancel()
			ctx = c
		}
		stopped <- cl.Stop(ctx, owner)
	}()
	after := offer(5 * time.Second)
	if err := <-stopped; err != nil && !abrupt {
		t.Fatal(err)
	}
	t.Logf("admitted at 2× offered: %.0f tokens in 2 s before the failover, %.0f in 5 s from it (limit %.0f/s)", before, after, limit)
	// Bound: 5 s at the limit plus one burst (1 s worth) for the hand-over;
	// a window reset to zero with clients admitting freely would exceed it.
	if after > limit*5+limit {
		t.Fatalf("after failover: admitted %.0f tokens in 5s, bound %.0f", after, limit*6)
	}
	if after < 0.5*limit*5 {
		t.Fatalf("after failover: admitted only %.0f tokens in 5s: clients did not move on", after)
	}
	for i, c := range clients {
		st := c.Stats()
		if st.UpdatesReceived <= upd0 || st.StaleTenant != 0 {
			t.Errorf("client %d: %+v: not following the new owner", i, st)
		}
		// The stopped owner ends its streams (Unavailable), and the cluster
		// view moves on too; which reaches a client first depends on
		// scheduling (on a loaded machine the view often wins), so the
		// re-route count is reported, not asserted: following the new owner
		// (above) is the property.
		if abrupt {
			t.Logf("client %d: re-routes on stream errors: %d", i, st.Reroutes)
		}
	}
}

// TestSyncRejectsBadInput: a malformed report ends the stream with
// InvalidArgument naming the problem.
func TestSyncRejectsBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cl := startRateCluster(t, "defaults:\n  ingestion_rate: 10\n")
	cc, err := grpc.NewClient(cl.Node(0).GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, c := range []struct {
		rep  *api.RateReport
		code codes.Code
	}{
		{&api.RateReport{Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}, codes.InvalidArgument},
		{&api.RateReport{ClientId: 1, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, NewIds: []uint32{1}, NewNames: []string{"bad tenant"},
			Ids: []uint32{}}, codes.InvalidArgument},
		{&api.RateReport{ClientId: 1, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, Ids: []uint32{5}, ConsumedTotal: []uint64{1},
			OfferedTotal: []uint64{1}, BucketStartUnixNanos: []int64{0}, BucketConsumed: []uint64{0}, PrevBucketConsumed: []uint64{0}}, codes.InvalidArgument},
		{&api.RateReport{ClientId: 1, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, NewIds: []uint32{1 << 30}, NewNames: []string{"t"}}, codes.ResourceExhausted},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := api.NewRateLimitClient(cc).Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(c.rep); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != c.code {
			t.Errorf("report %v: %v, want %v", c.rep, err, c.code)
		}
		cancel()
	}
}
