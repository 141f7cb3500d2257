package clientlib

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// testCluster is n real nodes (one per zone, every group on all of them) in
// this process, with real raft on disk and real gRPC on loopback
// (servertest); nodes is every node in start order.
type testCluster struct {
	*servertest.Cluster
	t     testing.TB
	nodes []*server.Server
}

// startCluster starts n nodes whose tenants may hold maxSeries series, with
// leader balancing off (leaders stay where the elections put them). With
// -short (make test-fast) servertest skips cluster tests, in one place:
// elections take seconds each; make test runs them.
func startCluster(t testing.TB, n int, maxSeries int64) *testCluster {
	t.Helper()
	sc := servertest.Start(t, servertest.Options{Nodes: n, Configure: func(_ int, cfg *server.Config) {
		cfg.Cluster.LeaderBalanceInterval, cfg.Tracking.DefaultMaxSeries = -1, maxSeries
	}})
	return &testCluster{Cluster: sc, t: t, nodes: sc.Nodes()}
}

// stop stops node i gracefully; an error is logged (the node is stopped
// either way).
func (tc *testCluster) stop(i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tc.Stop(ctx, i); err != nil {
		tc.t.Logf("stop %s: %v", tc.nodes[i].NodeID(), err)
	}
}

// waitTB polls cond until it holds (tests and benchmarks); the bound only
// turns a hang into a failure.
func waitTB(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// nearEntry is the client's current near-limit entry for grp.
func nearEntry(c *Client, grp int) nearGroup {
	nt := c.near.Load()
	if grp >= len(nt.groups) {
		return nearGroup{}
	}
	return nt.groups[grp]
}

func listed(c *Client, grp int, tenant string) bool {
	_, ok := nearEntry(c, grp).tenants[tenant]
	return ok
}

// TestSummaryStreamRealCluster: with three real nodes, a tenant filled past
// the near-limit fraction in group 0 shows up on a stream served by a follower
// of group 0 and the client tracks it sync there; dropping the tenant removes
// it; when the node serving the stream stops, the group moves to another node
// and new crossings still arrive.
func TestSummaryStreamRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster; skipped with -short")
	}
	const p = api.DefaultPartitions
	tc := startCluster(t, 3, 400) // share ceil(400 × 16 / 64) = 100 per group; near from 85
	var leader0 *server.Server
	waitFor(t, "a leader for group 0", func() bool { leader0 = tc.Leader(0); return leader0 != nil })

	writer := newTestClient(t, testConfig(leader0.GRPCAddr())) // ModeSync
	cfg := testConfig(leader0.GRPCAddr())
	cfg.Mode = ModeAuto
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	waitFor(t, "summaries for every group", func() bool {
		nt := c.near.Load()
		if len(nt.groups) == 0 {
			return false
		}
		for _, g := range nt.groups {
			if !g.known || g.from == "" {
				return false
			}
		}
		return true
	})
	if c.isSync(0, "hot") {
		t.Fatal("hot is sync before it sent anything")
	}

	// 90 series of "hot" in partition 0 (group 0): past 85% of the share.
	if rej, err := writer.TrackPartition(ctx, "hot", 0, hashesIn(0, p, 90)); err != nil || len(rej) != 0 {
		t.Fatalf("fill: %d rejected, %v", len(rej), err)
	}
	waitFor(t, "hot to be listed near its limit in group 0", func() bool { return listed(c, 0, "hot") })
	e := nearEntry(c, 0)
	if e.from == leader0.NodeID() {
		t.Errorf("group 0's summary came from its leader %s although followers are alive", e.from)
	}
	if e.index == 0 {
		t.Error("group 0's summary carries no applied index")
	}
	if !c.isSync(0, "hot") || c.isSync(1, "hot") {
		t.Errorf("sync decisions: group 0 %v (want true), group 1 %v (want false)", c.isSync(0, "hot"), c.isSync(1, "hot"))
	}
	st := c.Stats()
	if st.SummaryPolling || st.NearLimitPolls != 0 || st.SummaryStreams == 0 {
		t.Errorf("stats %+v: want streams, no polls", st)
	}

	// Dropping the tenant takes it below the fraction: it leaves the list.
	cc, err := grpc.NewClient(leader0.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := api.NewAdminClient(cc).DropTenant(ctx, &api.DropTenantRequest{Tenant: "hot"}); err != nil {
		t.Fatalf("drop tenant: %v", err)
	}
	waitFor(t, "hot to leave the list", func() bool { return !listed(c, 0, "hot") })
	if c.isSync(0, "hot") {
		t.Error("hot still sync in group 0 after the drop")
	}

	// Stop the node serving group 0's summary (a follower): the group moves
	// to another node, and a new crossing arrives through it.
	served := tc.Index(nearEntry(c, 0).from)
	if served < 0 || tc.nodes[served] == leader0 {
		t.Fatalf("group 0 served by %q", nearEntry(c, 0).from)
	}
	stoppedID := tc.nodes[served].NodeID()
	opened := c.Stats().SummaryStreamsOpened
	tc.stop(served)
	waitFor(t, "group 0's summary from another node", func() bool {
		e := nearEntry(c, 0)
		return e.from != "" && e.from != stoppedID
	})
	if rej, err := writer.TrackPartition(ctx, "hot2", 0, hashesIn(0, p, 95)); err != nil || len(rej) != 0 {
		t.Fatalf("fill hot2: %d rejected, %v", len(rej), err)
	}
	waitFor(t, "hot2 to be listed after the reconnection", func() bool { return listed(c, 0, "hot2") })
	if !c.isSync(0, "hot2") {
		t.Error("hot2 not sync")
	}
	// The stream to the stopped node ended (broken by it, or re-planned once
	// the view said it left) and another one took group 0.
	if st := c.Stats(); st.SummaryStreamsOpened <= opened {
		t.Errorf("stats %+v: want a new stream opened after the stop", st)
	}
	t.Logf("client stats: %+v", c.Stats())
}

// oldTracker is what a server from before WatchSummaries looks like: a gRPC
// server with the Tracker service only, forwarding every call to a real node
// and presenting its own address in cluster views (so clients talk to it, not
// to the real node behind it).
type oldTracker struct {
	api.UnimplementedTrackerServer
	up      api.TrackerClient
	rewrite map[string]string // real node address → its proxy's address
}

// startOldTrackers puts one such proxy in front of each real node and
// returns their addresses.
func startOldTrackers(t testing.TB, reals ...string) []string {
	t.Helper()
	rewrite := map[string]string{}
	var lis []net.Listener
	for _, r := range reals {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis = append(lis, l)
		rewrite[r] = l.Addr().String()
	}
	var out []string
	for i, r := range reals {
		cc, err := grpc.NewClient(r, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		api.RegisterTrackerServer(gs, &oldTracker{up: api.NewTrackerClient(cc), rewrite: rewrite})
		go func() { _ = gs.Serve(lis[i]) }()
		t.Cleanup(func() { gs.Stop(); _ = cc.Close() })
		out = append(out, lis[i].Addr().String())
	}
	return out
}

func (o *oldTracker) TrackSeries(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
	return o.up.TrackSeries(ctx, req)
}

func (o *oldTracker) GetUsersCloseToLimit(ctx context.Context, req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
	return o.up.GetUsersCloseToLimit(ctx, req)
}

func (o *oldTracker) WatchCluster(req *api.WatchClusterRequest, stream grpc.ServerStreamingServer[api.ClusterView]) error {
	up, err := o.up.WatchCluster(stream.Context(), req)
	if err != nil {
		return err
	}
	for {
		v, err := up.Recv()
		if err != nil {
			return err
		}
		for _, m := range v.Members {
			if a, ok := o.rewrite[m.GrpcAddress]; ok {
				m.GrpcAddress = a
			}
		}
		for _, gi := range v.GroupInfo {
			if a, ok := o.rewrite[gi.LeaderGrpcAddress]; ok {
				gi.LeaderGrpcAddress = a
			}
		}
		if err := stream.Send(v); err != nil {
			return err
		}
	}
}

// TestSummaryFallbackToPolling: against a server without the Summaries
// service the client polls GetUsersCloseToLimit, says so once in its log and
// in its stats, and still tracks a near-limit tenant sync.
func TestSummaryFallbackToPolling(t *testing.T) {
	const p = api.DefaultPartitions
	s := startServer(t, 40) // share 10 per group
	addr := startOldTrackers(t, s.GRPCAddr())[0]
	var logs syncBuffer
	cfg := testConfig(addr)
	cfg.Mode = ModeAuto
	cfg.NearLimitRefresh = 10 * time.Millisecond
	cfg.watchReprobe = 50 * time.Millisecond // several re-probes during the test
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	waitFor(t, "the client to fall back to polling", func() bool { return c.Stats().SummaryPolling })
	if rej, err := c.TrackPartition(ctx, "hot", 0, hashesIn(0, p, 10)); err != nil || len(rej) != 0 {
		t.Fatalf("fill: %x, %v", rej, err)
	}
	waitFor(t, "the poll to list hot in group 0", func() bool { return listed(c, 0, "hot") && c.Stats().NearLimitPolls > 0 })
	if !c.isSync(0, "hot") || c.isSync(1, "hot") {
		t.Error("sync decisions do not follow the polled list")
	}
	// Let a few re-probes happen: the fallback is still logged once.
	polls := c.Stats().NearLimitPolls
	waitFor(t, "more polls after re-probes", func() bool { return c.Stats().NearLimitPolls > polls+20 })
	if n := strings.Count(logs.String(), "does not implement WatchSummaries"); n != 1 {
		t.Errorf("fallback logged %d times, want once:\n%s", n, logs.String())
	}
	if st := c.Stats(); st.SummaryUpdates != 0 {
		t.Errorf("stats %+v: summaries from a server without the service", st)
	}
}

// TestSummaryStaleIndexIgnored: per group, a summary computed at a lower
// applied index than one already installed is ignored, whichever stream it
// comes from, while the stream's own view stays consistent for later updates.
func TestSummaryStaleIndexIgnored(t *testing.T) {
	c := &Client{cfg: Config{Mode: ModeAuto, NearLimitRefresh: time.Second, AsyncTimeout: 2 * time.Second}}
	c.near.Store(newNearTable(2))
	a, b := summaryMirror{}, summaryMirror{}
	full := func(g uint32, idx uint64, tenants ...string) *api.SummaryUpdate {
		return &api.SummaryUpdate{ServedBy: "x", Groups: []*api.GroupSummary{{Group: g, AppliedIndex: idx, Full: true, Added: tenants}}}
	}
	change := func(g uint32, idx uint64, added, removed []string) *api.SummaryUpdate {
		return &api.SummaryUpdate{ServedBy: "x", Groups: []*api.GroupSummary{{Group: g, AppliedIndex: idx, Added: added, Removed: removed}}}
	}
	c.applySummary(a, full(0, 10, "a"))
	if !listed(c, 0, "a") || nearEntry(c, 0).index != 10 {
		t.Fatalf("first summary not installed: %+v", nearEntry(c, 0))
	}
	// A lagging node's full state at index 8: ignored.
	c.applySummary(b, full(0, 8, "b"))
	if listed(c, 0, "b") || !listed(c, 0, "a") || c.Stats().SummaryStale != 1 {
		t.Fatalf("stale summary applied: %+v, stats %+v", nearEntry(c, 0), c.Stats())
	}
	// Its next change at index 9 (still behind): ignored as well.
	c.applySummary(b, change(0, 9, []string{"c"}, nil))
	if listed(c, 0, "c") || c.Stats().SummaryStale != 2 {
		t.Fatalf("stale change applied: %+v", nearEntry(c, 0))
	}
	// Once it is ahead, its whole state is installed: b, c and d, not a.
	c.applySummary(b, change(0, 12, []string{"d"}, nil))
	e := nearEntry(c, 0)
	if e.index != 12 || len(e.tenants) != 3 || !listed(c, 0, "b") || !listed(c, 0, "c") || !listed(c, 0, "d") || listed(c, 0, "a") {
		t.Fatalf("state at 12: %+v", e)
	}
	// The first stream's heartbeat at 11 is stale now.
	c.applySummary(a, &api.SummaryUpdate{Heartbeat: true, Groups: []*api.GroupSummary{{Group: 0, AppliedIndex: 11}}})
	if nearEntry(c, 0).index != 12 || c.Stats().SummaryStale != 3 {
		t.Fatalf("stale heartbeat applied: %+v", nearEntry(c, 0))
	}
	// Equal index (limits reloaded on the server: same log, other set) is applied.
	c.applySummary(b, change(0, 12, nil, []string{"b"}))
	if listed(c, 0, "b") {
		t.Fatal("change at the same index ignored")
	}
	// Group 1 is independent of group 0's indexes.
	c.applySummary(a, full(1, 3, "z"))
	if !listed(c, 1, "z") || !c.isSync(1, "z") || c.isSync(1, "a") {
		t.Fatalf("group 1: %+v", nearEntry(c, 1))
	}
	// A change for a group the stream never got in full is ignored, and an
	// unavailable group is reported and forgotten by the stream.
	c.applySummary(b, change(1, 50, []string{"q"}, nil))
	if listed(c, 1, "q") {
		t.Fatal("change without a full state applied")
	}
	bad := c.applySummary(a, &api.SummaryUpdate{Groups: []*api.GroupSummary{{Group: 1, Unavailable: "lost contact"}}})
	if len(bad) != 1 || bad[0] != 1 || a[1] != nil {
		t.Fatalf("unavailable group: reported %v, mirror %v", bad, a[1])
	}
	if !listed(c, 1, "z") {
		t.Error("an unavailable notice must not clear the table (it ages out instead)")
	}
}
