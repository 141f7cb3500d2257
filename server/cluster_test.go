package server

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
)

const testToken = "s3cret"

// testGossipKeys is the gossip key of test clusters: a multi-node cluster
// with credentials refuses to start without one (or TLS), and it is the
// cluster key nodes authenticate to each other with (nodeauth.go).
var testGossipKeys = [][]byte{bytes.Repeat([]byte{0x5a}, 32)}

// skipClusterIfShort skips a test that starts an n-node cluster (n > 1) under
// -short: elections, joins and failovers take seconds each and make up most of
// this package's test time, so the fast loop leaves them to make test.
func skipClusterIfShort(t testing.TB, n int) {
	t.Helper()
	if n > 1 && testing.Short() {
		t.Skipf("cluster test (%d nodes): runs in make test, skipped with -short", n)
	}
}

type testCluster struct {
	t     *testing.T
	nodes []*Server
	dirs  []string
}

// startCluster starts n in-process nodes on loopback and waits until every
// group has a leader. With -short (make test-fast) a test asking for more than
// one node is skipped here, so every cluster test, present and future, stays
// out of the fast loop and runs in make test without a per-test guard.
func startCluster(t *testing.T, n int, mod func(i int, c *Config)) *testCluster {
	t.Helper()
	skipClusterIfShort(t, n)
	tc := &testCluster{t: t}
	var seed string
	for i := range n {
		dir := t.TempDir()
		cfg := Config{
			Node: NodeConfig{
				ID:       fmt.Sprintf("n%d", i+1),
				Zone:     fmt.Sprintf("zone-%c", 'a'+i),
				DataDir:  dir,
				GRPCAddr: "127.0.0.1:0",
				HTTPAddr: "-",
			},
			Raft:     RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
			Gossip:   GossipConfig{Addr: "127.0.0.1:0", ProbeInterval: 200 * time.Millisecond},
			Cluster:  ClusterConfig{BootstrapExpect: n},
			Access:   AccessConfig{AdminToken: testToken, TLS: TLSConfig{GossipKeys: testGossipKeys}},
			Tracking: TrackingConfig{DefaultMaxSeries: 6400}, // group share 1600
			Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		}
		if seed != "" {
			cfg.Gossip.Join = []string{seed}
		}
		if n == 1 {
			// One voter: short raft timers, as in startServer (why there).
			// Clusters of several nodes keep raftnode's defaults, the timers
			// their elections and failovers are meant to be tested with.
			cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
			cfg.Raft.LeaderLeaseTimeout = 50 * time.Millisecond
		}
		if mod != nil {
			mod(i, &cfg)
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if seed == "" {
			seed = s.GossipAddr()
		}
		tc.nodes = append(tc.nodes, s)
		tc.dirs = append(tc.dirs, dir)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, s := range tc.nodes {
			if s != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_ = s.Stop(ctx)
				}()
			}
		}
		wg.Wait()
	})
	tc.waitReady()
	return tc
}

func (tc *testCluster) live() []*Server {
	var out []*Server
	for _, s := range tc.nodes {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

func (tc *testCluster) waitReady() {
	deadline := time.Now().Add(60 * time.Second) // generous: only catches hangs
	for {
		var why []string
		for _, s := range tc.live() {
			if r := s.NotReadyReason(); r != "" {
				why = append(why, s.cfg.Node.ID+": "+r)
			}
		}
		if len(why) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("nodes not ready: %v", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leader returns the live node leading group g.
func (tc *testCluster) leader(g int) *Server {
	var out *Server
	waitFor(tc.t, fmt.Sprintf("a leader for group %d", g), func() bool {
		for _, s := range tc.live() {
			if s.Raft(g).State() == raft.Leader && s.trackers[g].ready() {
				out = s
				return true
			}
		}
		return false
	})
	return out
}

// trackLeader tracks on group g's current leader and retries while
// leadership moves (the leader balancer transfers groups soon after start;
// a client retries Unavailable the same way). It returns the rejected hashes.
func (tc *testCluster) trackLeader(g int, tenant string, part int, hs []uint64) []uint64 {
	tc.t.Helper()
	deadline := time.Now().Add(30 * time.Second) // catches hangs only
	for {
		l := tc.leader(g)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := api.NewTrackerClient(dial(tc.t, l.GRPCAddr())).TrackSeries(ctx,
			&api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(part), Hashes: hs})
		cancel()
		if err == nil {
			return resp.RejectedHashes
		}
		if !retryable(err) || time.Now().After(deadline) {
			tc.t.Fatalf("TrackSeries(%s, partition %d, %d hashes) on %s: %v", tenant, part, len(hs), l.cfg.Node.ID, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// retryable reports what a client retries: Unavailable (no leader, or
// leadership lost before commit: a retry of a maybe-recorded series is a
// refresh) and NotLeader (the leader moved since tc.leader looked).
func retryable(err error) bool {
	st := status.Convert(err)
	if st.Code() == codes.Unavailable {
		return true
	}
	for _, d := range st.Details() {
		if _, ok := d.(*api.NotLeader); ok {
			return true
		}
	}
	return false
}

// testTokenAuth sends the test admin token (testToken) with calls that carry
// no authorization of their own: a node with an admin token answers no
// endpoint that writes or reveals tenant data without a credential, and the
// admin token satisfies every scope. Nodes without one ignore it.
var testTokenAuth = grpc.WithPerRPCCredentials(defaultToken(testToken))

type defaultToken string

func (t defaultToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get("authorization")) > 0 {
		return nil, nil // the call names its own credential (or a wrong one, on purpose)
	}
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (defaultToken) RequireTransportSecurity() bool { return false }

// testHTTP is an HTTP client sending testToken with requests that carry no
// Authorization header (a node with an admin token serves no dashboard
// data without a credential).
var testHTTP = &http.Client{Transport: testTokenTransport{}}

type testTokenTransport struct{}

func (testTokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, ok := r.Header["Authorization"]; !ok {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+testToken)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// dial connects to addr in plaintext, sending testToken by default.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// dialAnon connects to addr in plaintext with no credential.
func dialAnon(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func adminCtx(t *testing.T) context.Context { return adminCtxFor(t, 30*time.Second) }

// adminCtxFor is adminCtx with a deadline d from now.
func adminCtxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
}

func TestClusterPlacementLeadersAndFailover(t *testing.T) {
	// Static shares: the end of the test counts against group 0's fixed
	// share (movable shares: shares_test.go).
	tc := startCluster(t, 3, func(_ int, c *Config) { staticShares(c) })
	// Every group: three voters, one per zone.
	for g := range 4 {
		peers, _, err := peersOf(tc.nodes[0].Raft(g))
		if err != nil {
			t.Fatal(err)
		}
		if len(peers) != 3 {
			t.Fatalf("group %d: %d peers, want 3", g, len(peers))
		}
	}
	// A write to a non-leader gets NotLeader with the leader's gRPC address.
	g0 := tc.leader(0)
	var follower *Server
	for _, s := range tc.nodes {
		if s != g0 {
			follower = s
			break
		}
	}
	waitFor(t, "follower view names the leader", func() bool {
		_, addr := follower.leaderOf(0)
		return addr == g0.GRPCAddr()
	})
	_, err := api.NewTrackerClient(dial(t, follower.GRPCAddr())).TrackSeries(context.Background(),
		&api.TrackSeriesRequest{Tenant: "t", Partition: 0, Hashes: hashesIn(1, 0, 10)})
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("write to follower: %v, want FailedPrecondition", err)
	}
	var nl *api.NotLeader
	for _, d := range st.Details() {
		if x, ok := d.(*api.NotLeader); ok {
			nl = x
		}
	}
	if nl == nil || nl.LeaderGrpcAddress != g0.GRPCAddr() || nl.LeaderId != g0.cfg.Node.ID {
		t.Fatalf("NotLeader detail %+v, want leader %s at %s", nl, g0.cfg.Node.ID, g0.GRPCAddr())
	}

	// The watch stream describes members and leaders.
	ws, err := api.NewTrackerClient(dial(t, follower.GRPCAddr())).WatchCluster(context.Background(), &api.WatchClusterRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := ws.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Members) != 3 || len(v.GroupInfo) != 4 || v.GroupInfo[0].LeaderGrpcAddress != g0.GRPCAddr() || len(v.GroupInfo[0].Voters) != 3 {
		t.Fatalf("cluster view: %v", v)
	}

	// Accept series on the leader, then stop it; the new leader must accept
	// every one of them again (never reject an accepted active series).
	accepted := hashesIn(2, 0, 1000)
	if rej := track(t, api.NewTrackerClient(dial(t, g0.GRPCAddr())), "t", 0, accepted); len(rej) != 0 {
		t.Fatalf("%d rejected below the limit", len(rej))
	}
	for i, s := range tc.nodes {
		if s == g0 {
			stop(t, s)
			tc.nodes[i] = nil
		}
	}
	nl0 := tc.leader(0)
	// The stopped node left gracefully; the survivors report it.
	waitFor(t, "a member reported as left in metrics", func() bool {
		return gaugeValue(t, nl0, "tollgate_cluster_members", "status", "left") == 1 &&
			gaugeValue(t, nl0, "tollgate_cluster_members", "status", "alive") == 2
	})
	c := api.NewTrackerClient(dial(t, nl0.GRPCAddr()))
	if rej := track(t, c, "t", 0, accepted); len(rej) != 0 {
		t.Fatalf("after failover %d accepted series were rejected", len(rej))
	}
	// The static group share is 1600: 600 more fit, the rest is rejected.
	more := hashesIn(3, 0, 1000)
	if rej := track(t, c, "t", 0, more); len(rej) != 400 {
		t.Fatalf("after failover: %d of 1000 new rejected, want 400 (share 1600, 1000 held)", len(rej))
	}
}

func TestAdminMembershipAndTransfer(t *testing.T) {
	tc := startCluster(t, 3, func(_ int, c *Config) { c.Cluster.LeaderBalanceInterval = -1 })
	ctx := adminCtx(t)
	// Ask a node that does not lead group 1: the call is forwarded.
	l1 := tc.leader(1)
	var other *Server
	for _, s := range tc.nodes {
		if s != l1 {
			other = s
			break
		}
	}
	adm := api.NewAdminClient(dialAnon(t, other.GRPCAddr()))
	if _, err := adm.ListPeers(context.Background(), &api.ListPeersRequest{Group: 1}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without token: %v, want Unauthenticated", err)
	}
	lp, err := adm.ListPeers(ctx, &api.ListPeersRequest{Group: 1})
	if err != nil || len(lp.Peers) != 3 {
		t.Fatalf("list peers: %v %v", lp, err)
	}
	var victim string
	for _, p := range lp.Peers {
		if !p.Leader {
			victim = p.Id
		}
	}
	rm, err := adm.RemoveServer(ctx, &api.RemoveServerRequest{Group: 1, Id: victim})
	if err != nil || len(rm.Peers) != 2 {
		t.Fatalf("remove %s: %v %v", victim, rm, err)
	}
	if _, err := adm.RemoveServer(ctx, &api.RemoveServerRequest{Group: 1, Id: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("remove unknown: %v, want NotFound", err)
	}
	add, err := adm.AddVoter(ctx, &api.AddVoterRequest{Group: 1, Id: victim})
	if err != nil || len(add.Peers) != 3 {
		t.Fatalf("add %s back: %v %v", victim, add, err)
	}
	// A transfer is best effort in raft: the target gets TimeoutNow, but under
	// load another voter's election timer may fire first and win. Retry a few
	// times; what must hold is that it eventually lands on the target.
	var tr *api.TransferLeadershipResponse
	for attempt := 0; attempt < 5; attempt++ {
		tr, err = adm.TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: 1, ToId: victim})
		if err == nil && tr.NewLeaderId == victim {
			break
		}
		t.Logf("transfer attempt %d: %v %v", attempt, tr, err)
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || tr.NewLeaderId != victim {
		t.Fatalf("transfer to %s: %v %v", victim, tr, err)
	}
	stResp, err := adm.Status(ctx, &api.StatusRequest{})
	if err != nil || len(stResp.Nodes) != 3 || len(stResp.Unreachable) != 0 {
		t.Fatalf("status: %v %v", stResp, err)
	}
	if _, err := adm.ListPeers(ctx, &api.ListPeersRequest{Group: 9}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad group: %v", err)
	}
}

// TestLeadersBalance drives the balancer's own pieces (BalanceInput →
// PlanBalance → MoveLeader, what the cluster loop runs every interval) on a
// real 3-node cluster from a skewed start, one move at a time on a settled
// cluster, until no node plans a move. It fails, with the history of moves,
// if the planner stops before leaders are within one of even, or if it keeps
// moving long after it should have converged. Waits only bound hangs.
func TestLeadersBalance(t *testing.T) {
	const groups = 6
	// The loop's own balancing is off so the test decides when a move runs.
	tc := startCluster(t, 3, func(i int, c *Config) {
		c.Layout.Groups, c.Cluster.LeaderBalanceInterval = groups, -1
	})
	nodes := tc.nodes
	byID := map[string]*Server{}
	for _, s := range nodes {
		byID[s.cfg.Node.ID] = s
	}
	// Skew: every group's leadership to n1. Transfers are best effort, so
	// retry until it holds.
	n1 := nodes[0]
	waitFor(t, "n1 leading every group", func() bool {
		all := true
		for g := range groups {
			for _, s := range nodes {
				if s != n1 && s.Raft(g).State() == raft.Leader {
					all = false
					_ = s.Raft(g).LeadershipTransferToServer(raft.ServerID(n1.cfg.Node.ID), raft.ServerAddress(n1.RaftAddr())).Error()
				}
			}
		}
		return all && len(n1.ledGroups()) == groups
	})

	// settled returns every node's balance input once raft has one leader per
	// group and every node's gossiped view of who leads what agrees with raft,
	// so each plan starts from the truth.
	var inputs []cluster.BalanceInput
	var state string
	settled := func() bool {
		led := map[string][]int{}
		owner := map[int]string{}
		for _, s := range nodes {
			led[s.cfg.Node.ID] = s.ledGroups()
			for _, g := range led[s.cfg.Node.ID] {
				if o, dup := owner[g]; dup {
					state = fmt.Sprintf("group %d led by both %s and %s", g, o, s.cfg.Node.ID)
					return false
				}
				owner[g] = s.cfg.Node.ID
			}
		}
		state = fmt.Sprint(led)
		if len(owner) != groups {
			return false
		}
		inputs = inputs[:0]
		for _, s := range nodes {
			in := s.ctl.BalanceInput()
			var own []int
			for _, gc := range in.Led {
				own = append(own, gc.Group)
			}
			if !slices.Equal(own, led[s.cfg.Node.ID]) {
				state = fmt.Sprintf("raft %v; %s's controller sees itself leading %v", led, s.cfg.Node.ID, own)
				return false
			}
			if a := alive(in.Members); len(a) != len(nodes) {
				state = fmt.Sprintf("raft %v; %s sees %d of %d members alive: %+v", led, s.cfg.Node.ID, len(a), len(nodes), in.Members)
				return false
			}
			for _, m := range alive(in.Members) {
				if !slices.Equal(m.GroupsLed, led[m.ID]) {
					state = fmt.Sprintf("raft %v; %s's gossip says %s leads %v", led, s.cfg.Node.ID, m.ID, m.GroupsLed)
					return false // gossip still lags
				}
			}
			inputs = append(inputs, in)
		}
		return true
	}

	var history []string
	var last *cluster.LeaderMove
	for {
		// Up to a minute: a gossip update lost on a loaded machine is
		// repaired by memberlist's push-pull, every 30 s.
		for deadline := time.Now().Add(time.Minute); !settled(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for a settled cluster (one leader per group, gossip agrees with raft): %s; moves: %v", state, history)
			}
		}
		if last != nil && byID[string(last.To.ID)].Raft(last.Group).State() != raft.Leader {
			// Raft's transfer is best effort: an election may have won; the
			// next plan starts from whatever holds now.
			history[len(history)-1] += " (did not land)"
		}
		var mover *Server
		var mv cluster.LeaderMove
		for i, in := range inputs {
			if m, ok := cluster.PlanBalance(in); ok {
				mover, mv = nodes[i], m
				break
			}
		}
		if mover == nil {
			break
		}
		history = append(history, fmt.Sprintf("%s: group %d → %s (%d vs %d)", mover.cfg.Node.ID, mv.Group, mv.To.ID, mv.LedHere, mv.LedThere))
		// 6/0/0 needs 4 moves; a transfer lost to an election costs another.
		// Far more means the planner moves without converging.
		if len(history) > 20 {
			t.Fatalf("balancer still moving after %d moves (now %s): %v", len(history), state, history)
		}
		mover.ctl.MoveLeader(mv)
		last = &mv
	}
	counts := map[string]int{}
	for _, in := range inputs {
		counts[in.Self] = len(in.Led)
	}
	lo, hi := groups, 0
	for _, n := range counts {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 || lo < 1 {
		t.Fatalf("no node plans a move, but leaders are %v (%s), not within one of even; moves: %v", counts, state, history)
	}
	if len(history) == 0 {
		t.Fatalf("from n1 leading all %d groups the planner moved nothing, yet ended at %v", groups, counts)
	}
	t.Logf("balanced %v after %d moves: %v", counts, len(history), history)
}

func TestSnapshotRestoreRollsBackOnEveryReplica(t *testing.T) {
	tc := startCluster(t, 3, nil)
	ctx := adminCtx(t)
	l := tc.leader(0)
	c := api.NewTrackerClient(dial(t, l.GRPCAddr()))
	before := hashesIn(10, 1, 500)
	track(t, c, "t", 1, before)

	adm := api.NewAdminClient(dial(t, tc.nodes[2].GRPCAddr()))
	ss, err := adm.SnapshotGroup(ctx, &api.SnapshotGroupRequest{Group: 0})
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for {
		ch, err := ss.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, ch.Data...)
	}
	want := stripIndex(data)

	after := hashesIn(11, 1, 300)
	track(t, c, "t", 1, after)

	restore := func(d []byte, crc uint32) (*api.RestoreGroupResponse, error) {
		up, err := adm.RestoreGroup(ctx)
		if err != nil {
			return nil, err
		}
		if err := up.Send(&api.RestoreChunk{Header: &api.RestoreHeader{Group: 0, Size: uint64(len(d)), Crc32C: crc}}); err != nil {
			return nil, err
		}
		for i := 0; i < len(d); i += 1000 {
			if err := up.Send(&api.RestoreChunk{Data: d[i:min(i+1000, len(d))]}); err != nil {
				break
			}
		}
		return up.CloseAndRecv()
	}
	crc := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	// A damaged snapshot is refused and nothing changes.
	bad := slices.Clone(data)
	bad[len(bad)/2] ^= 1
	if _, err := restore(bad, crc); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("damaged snapshot: %v, want InvalidArgument", err)
	}
	if _, err := restore(data, crc); err != nil {
		t.Fatal(err)
	}
	for _, s := range tc.nodes {
		waitFor(t, "replica "+s.cfg.Node.ID+" holds exactly the snapshot", func() bool {
			return string(snapshotOfLive(t, s, 0)) == string(want)
		})
	}
	// Writes continue after the restore; the rolled-back series are new again.
	l = tc.leader(0)
	if rej := track(t, api.NewTrackerClient(dial(t, l.GRPCAddr())), "t", 1, after); len(rej) != 0 {
		t.Fatalf("after restore: %d rejected", len(rej))
	}
}

// snapshotOfLive snapshots a replica through raft's own path, which is safe while
// applies run.
func snapshotOfLive(t *testing.T, s *Server, g int) []byte {
	t.Helper()
	_, rc, err := s.host.Snapshot(g, 5*time.Second)
	if err != nil {
		return []byte(err.Error())
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return stripIndex(b)
}

// gaugeValue reads one labelled sample from a node's metrics registry (-1 if absent).
func gaugeValue(t *testing.T, s *Server, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// Two nodes per zone: each group still gets exactly one voter per zone, the one
// placement picks, so groups spread over a zone's nodes.
func TestBootstrapTwoNodesPerZone(t *testing.T) {
	tc := startCluster(t, 6, func(i int, c *Config) {
		c.Node.Zone = fmt.Sprintf("zone-%c", 'a'+i/2)
		c.Layout.Groups = 8
		// What bootstrap placed, before elastic placement moves voters
		// towards PlaceAll's choice (TestPlanMoves*, faulttest
		// TestScaleOutAndIn); on a slow machine a move came first.
		c.Cluster.MoveInterval = -1
	})
	ms := alive(tc.nodes[0].memberList())
	if len(ms) != 6 {
		t.Fatalf("%d alive members, want 6", len(ms))
	}
	hosting := map[string]int{}
	for g := range 8 {
		peers, _, err := peersOf(tc.leader(g).Raft(g))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range peers {
			got = append(got, p.Id)
			hosting[p.Id]++
		}
		var want []string
		for _, m := range cluster.Placement(g, ms, 3) {
			want = append(want, m.ID)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("group %d voters %v, placement says %v", g, got, want)
		}
	}
	if len(hosting) < 5 {
		t.Fatalf("8 groups landed on only %d of 6 nodes: %v", len(hosting), hosting)
	}

	// A node without a replica of a group forwards GetUsersCloseToLimit.
	var outsider *Server
	g := 0
	for _, s := range tc.nodes {
		if !s.hostsGroup(g) {
			outsider = s
			break
		}
	}
	lo, _ := api.GroupRange(g, 64, 8)
	// Group share with G=8: ceil(6400·8/64) = 800; 700 ≥ 0.85·800.
	tc.trackLeader(g, "near", lo, hashesIn(5, lo, 700))
	waitFor(t, "outsider reports the near-limit tenant", func() bool {
		resp, err := api.NewTrackerClient(dial(t, outsider.GRPCAddr())).GetUsersCloseToLimit(context.Background(),
			&api.GetUsersCloseToLimitRequest{Partition: uint32(lo)})
		return err == nil && slices.Equal(resp.Tenants, []string{"near"})
	})
}

// terms is each served group's highest raft term over the live nodes: it
// moves with every election and leadership transfer, so a test that claims
// exactness only under a stable owner can tell when the owner changed.
func (tc *testCluster) terms() []uint64 {
	var out []uint64
	for _, s := range tc.live() {
		for g := 0; g < s.servedGroups(); g++ {
			term, _ := strconv.ParseUint(s.host.Raft(g).Stats()["term"], 10, 64)
			if g >= len(out) {
				out = append(out, 0)
			}
			out[g] = max(out[g], term)
		}
	}
	return out
}
