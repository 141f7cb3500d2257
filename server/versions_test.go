package server

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/testports"
)

// serverPorts: this package's range for nodes restarted on fixed ports,
// below Linux's ephemeral range (32768–60999: a port handed out by ":0"
// could be taken, between the check and the node's bind, as the source port
// of some other test's outgoing connection) and apart from faulttest's
// (20000–31999) and cmd/tollgate's (10000–19999), which run beside these.
var serverPorts = testports.Range{Lo: 32000, Hi: 32768}

// loopbackPort returns a loopback port free for TCP and UDP (serf needs both),
// so a node can be restarted on the same addresses. A port is never handed
// out twice: picked independently, a node's gRPC and gossip ports once came
// out the same, and the gossip bind failed.
func loopbackPort(t *testing.T) string {
	t.Helper()
	p, err := serverPorts.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// startOldNewCluster starts n1, n2 at the current cluster version and n3 as an
// "old build" (cluster version 1) on fixed addresses, so it can be restarted.
func startOldNewCluster(t *testing.T) (*testCluster, Config) {
	var oldCfg Config
	tc := startCluster(t, 3, func(i int, c *Config) {
		if i == 2 {
			c.Node.GRPCAddr, c.Raft.Addr, c.Gossip.Addr = loopbackPort(t), loopbackPort(t), loopbackPort(t)
			c.Cluster.MaxClusterVersion = 1
			oldCfg = *c
		}
	})
	return tc, oldCfg
}

func trackGroup0(t *testing.T, tc *testCluster, tenant string, seed uint64, n int) {
	t.Helper()
	for p := range 4 { // partitions 0..3 are in group 0 (64 partitions, 4 groups)
		for {
			l := tc.leader(0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := api.NewTrackerClient(dial(t, l.GRPCAddr())).TrackSeries(ctx,
				&api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(p), Hashes: hashesIn(seed, p, n)})
			cancel()
			if err == nil {
				break
			}
			if c := status.Code(err); c != codes.Unavailable && c != codes.FailedPrecondition {
				t.Fatalf("TrackSeries: %v", err)
			}
			time.Sleep(20 * time.Millisecond) // leadership moving: retry
		}
	}
}

// waitApplied waits until every live replica of g applied what its leader had
// applied when the call began.
func waitApplied(t *testing.T, tc *testCluster, g int) {
	t.Helper()
	target := tc.leader(g).FSM(g).AppliedIndex()
	waitFor(t, fmt.Sprintf("every replica of group %d applied index %d", g, target), func() bool {
		for _, s := range tc.live() {
			if s.FSM(g).AppliedIndex() < target {
				return false
			}
		}
		return true
	})
}

func TestDropTenantRefusedWhileAVoterLags(t *testing.T) {
	tc, _ := startOldNewCluster(t)
	trackGroup0(t, tc, "t", 1, 100)
	n1 := tc.nodes[0]
	waitFor(t, "n1 sees n3's version tag", func() bool {
		for _, m := range n1.memberList() {
			if m.ID == "n3" && m.Status == membership.StatusAlive {
				return m.ClusterVersion == 1
			}
		}
		return false
	})
	waitApplied(t, tc, 0)
	before := n1.FSM(0).TenantActive("t")
	if before != 400 {
		t.Fatalf("tenant t holds %d series, want 400", before)
	}
	adm := api.NewAdminClient(dial(t, n1.GRPCAddr()))
	_, err := adm.DropTenant(adminCtx(t), &api.DropTenantRequest{Tenant: "t"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "n3 supports cluster version 1") ||
		!strings.Contains(err.Error(), "drop-tenant needs cluster version 2") {
		t.Fatalf("DropTenant with an old voter: %v, want FailedPrecondition naming n3", err)
	}
	// The leader's own gate refuses a forwarded single-group call as well.
	g := uint32(0)
	_, err = adm.DropTenant(adminCtx(t), &api.DropTenantRequest{Tenant: "t", Group: &g})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "n3 supports cluster version 1") {
		t.Fatalf("single-group DropTenant with an old voter: %v", err)
	}
	waitApplied(t, tc, 0)
	for _, s := range tc.nodes {
		if got := s.FSM(0).TenantActive("t"); got != before {
			t.Fatalf("%s: tenant t holds %d series after a refused drop, want %d", s.cfg.Node.ID, got, before)
		}
	}
	// Bad input is InvalidArgument, not a version question.
	if _, err := adm.DropTenant(adminCtx(t), &api.DropTenantRequest{Tenant: ""}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("DropTenant(\"\"): %v", err)
	}
}

// TestHaltedReplicaReplaysAfterUpgrade bypasses the version gate to put a
// drop-tenant entry into group 0 while n3 runs as cluster version 1: n3 must
// halt the group (not skip the entry), say why in readiness and metrics, apply
// nothing after it, refuse to lead it, and converge once restarted as current.
func TestHaltedReplicaReplaysAfterUpgrade(t *testing.T) {
	tc, oldCfg := startOldNewCluster(t)
	n3 := tc.nodes[2]
	trackGroup0(t, tc, "t", 1, 100)
	trackGroup0(t, tc, "u", 2, 50)

	leader := tc.leader(0)
	if leader == n3 {
		if err := n3.Raft(0).LeadershipTransferToServer("n1", raft.ServerAddress(tc.nodes[0].RaftAddr())).Error(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "n1 leads group 0", func() bool { return tc.nodes[0].Raft(0).State() == raft.Leader && tc.nodes[0].trackers[0].ready() })
		leader = tc.nodes[0]
	}
	leader.vers.skipGate.Store(true)
	g := uint32(0)
	resp, err := leader.admin.DropTenant(context.Background(), &api.DropTenantRequest{Tenant: "t", Group: &g})
	if err != nil {
		t.Fatalf("forced drop-tenant: %v", err)
	}
	leader.vers.skipGate.Store(false)
	dropIndex := resp.Groups[0].Index
	if resp.Removed != 400 {
		t.Fatalf("drop removed %d series, want 400", resp.Removed)
	}

	waitFor(t, "n3 halts group 0", func() bool { h, _ := n3.FSM(0).Halted(); return h })
	if at := n3.FSM(0).HaltedAt(); at != dropIndex {
		t.Fatalf("n3 halted at index %d, the drop-tenant entry is %d", at, dropIndex)
	}
	why := n3.NotReadyReason()
	for _, want := range []string{"group 0 halted", "drop-tenant", "supports cluster version 1"} {
		if !strings.Contains(why, want) {
			t.Errorf("n3 readiness %q does not mention %q", why, want)
		}
	}
	if v := gaugeValue(t, n3, "tollgate_group_halted", "group", "0"); v != 1 {
		t.Errorf("tollgate_group_halted{group=0} on n3 = %v, want 1", v)
	}
	if v := gaugeValue(t, n3, "tollgate_group_halted", "group", "1"); v != 0 {
		t.Errorf("tollgate_group_halted{group=1} on n3 = %v, want 0", v)
	}
	if gs := n3.Status().Groups; !strings.Contains(gs[0].Halted, "drop-tenant") || gs[1].Halted != "" {
		t.Errorf("/api/v1/status on n3: group 0 halted %q, group 1 halted %q", gs[0].Halted, gs[1].Halted)
	}
	if err := n3.Raft(0).Snapshot().Error(); err == nil {
		t.Error("raft snapshot of a halted group succeeded: the log could be compacted past the unapplied entry")
	}
	// Status, asked on n1, shows n3's halt (gathered from n3) and every
	// member's cluster version, the lowest being the cluster's.
	st := adminStatus(t, tc.nodes[0])
	if st.ClusterVersion != 1 {
		t.Errorf("status cluster version %d, want 1 (n3's)", st.ClusterVersion)
	}
	for _, m := range st.View.Members {
		if want := map[string]uint32{"n1": fsm.CurrentClusterVersion, "n2": fsm.CurrentClusterVersion, "n3": 1}[m.Id]; m.ClusterVersion != want {
			t.Errorf("status: member %s cluster version %d, want %d", m.Id, m.ClusterVersion, want)
		}
	}
	if halts := haltedIn(st); len(halts) != 1 || !strings.Contains(halts["n3/0"], "supports cluster version 1") ||
		!strings.Contains(halts["n3/0"], "drop-tenant") {
		t.Errorf("status halts %v, want only n3's group 0, naming drop-tenant and version 1", halts)
	}

	// Writes continue on the other replicas; n3 applies none of them.
	trackGroup0(t, tc, "u", 3, 50)
	waitFor(t, "the leader applied past the drop", func() bool { return tc.leader(0).FSM(0).AppliedIndex() > dropIndex })
	if got := n3.FSM(0).AppliedIndex(); got >= dropIndex {
		t.Fatalf("halted n3 applied index %d, must stay below the drop-tenant entry %d", got, dropIndex)
	}
	if got := n3.FSM(0).TenantActive("t"); got != 400 {
		t.Fatalf("halted n3 holds %d series of t, want the 400 from before the halt", got)
	}

	// n3 must not lead group 0: given leadership, it gives it away.
	l := tc.leader(0)
	if err := l.Raft(0).LeadershipTransferToServer("n3", raft.ServerAddress(n3.RaftAddr())).Error(); err != nil {
		t.Fatalf("transfer to n3: %v", err)
	}
	waitFor(t, "group 0 led by a node other than n3 again", func() bool {
		for _, s := range tc.nodes[:2] {
			if s.Raft(0).State() == raft.Leader && s.trackers[0].ready() {
				return !n3.trackers[0].leading()
			}
		}
		return false
	})
	if err := n3.haltedStatus(0); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "supports cluster version 1") {
		t.Fatalf("halted status %v", err)
	}

	// Restart n3 with the current cluster version: it replays the log from
	// its last snapshot (before the drop) and converges.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := n3.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	tc.nodes[2] = nil
	newCfg := oldCfg
	newCfg.Cluster.MaxClusterVersion = 0
	n3, err = New(newCfg)
	if err != nil {
		t.Fatalf("restart n3: %v", err)
	}
	tc.nodes[2] = n3
	tc.waitReady()
	if n3.MaxClusterVersion() != fsm.CurrentClusterVersion {
		t.Fatalf("restarted n3 supports %d", n3.MaxClusterVersion())
	}
	trackGroup0(t, tc, "u", 4, 10) // a write after the restart: every replica must reach it
	waitApplied(t, tc, 0)
	l = tc.leader(0)
	want := snapshotOfLive(t, l, 0)
	for _, s := range tc.nodes {
		if h, why := s.FSM(0).Halted(); h {
			t.Fatalf("%s still halted: %s", s.cfg.Node.ID, why)
		}
		if got := s.FSM(0).TenantActive("t"); got != 0 {
			t.Errorf("%s: tenant t holds %d series after the drop, want 0", s.cfg.Node.ID, got)
		}
		if got := snapshotOfLive(t, s, 0); !bytes.Equal(got, want) {
			t.Errorf("%s: group 0 state differs from the leader's (%d vs %d bytes)", s.cfg.Node.ID, len(got), len(want))
		}
	}

	// With every node current, the gate opens.
	for _, s := range tc.nodes {
		waitFor(t, s.cfg.Node.ID+" sees n3 at the current version", func() bool {
			ok, _ := s.groupSupports(0, fsm.CurrentClusterVersion)
			return ok
		})
	}
	waitFor(t, "status shows cluster version "+strconv.Itoa(fsm.CurrentClusterVersion), func() bool {
		return adminStatus(t, tc.nodes[0]).ClusterVersion == fsm.CurrentClusterVersion
	})
	if halts := haltedIn(adminStatus(t, tc.nodes[0])); len(halts) != 0 {
		t.Errorf("status after the upgrade shows halts %v", halts)
	}
	trackGroup0(t, tc, "t", 5, 25)
	adm := api.NewAdminClient(dial(t, tc.nodes[1].GRPCAddr()))
	out, err := adm.DropTenant(adminCtx(t), &api.DropTenantRequest{Tenant: "t"})
	if err != nil {
		t.Fatalf("DropTenant after the upgrade: %v", err)
	}
	if out.Removed != 100 || len(out.Groups) != 4 {
		t.Fatalf("DropTenant after the upgrade: %v, want 100 removed over 4 groups", out)
	}
	for _, gd := range out.Groups {
		if wantN := map[uint32]uint64{0: 100}[gd.Group]; gd.Removed != wantN {
			t.Errorf("group %d: removed %d, want %d", gd.Group, gd.Removed, wantN)
		}
	}
}

// adminStatus calls the Admin Status RPC on s.
func adminStatus(t *testing.T, s *Server) *api.StatusResponse {
	t.Helper()
	st, err := api.NewAdminClient(dial(t, s.GRPCAddr())).Status(adminCtx(t), &api.StatusRequest{})
	if err != nil {
		t.Fatalf("status on %s: %v", s.cfg.Node.ID, err)
	}
	return st
}

// haltedIn maps "node/group" to the halt reason of every halted replica in st.
func haltedIn(st *api.StatusResponse) map[string]string {
	out := map[string]string{}
	for _, n := range st.Nodes {
		for _, g := range n.Groups {
			if g.HaltedReason != "" {
				out[fmt.Sprintf("%s/%d", n.NodeId, g.Group)] = g.HaltedReason
			}
		}
	}
	return out
}

// A node started with MaxClusterVersion 2 shows it in Status (its gossiped
// tag), and the cluster version is 2. (A node without gossip reports its own:
// the dev node of cmd/tollgate's TestStatusShowsVersionsAndHalts.)
func TestStatusShowsClusterVersions(t *testing.T) {
	tc := startCluster(t, 2, func(i int, c *Config) {
		if i == 1 {
			c.Cluster.MaxClusterVersion = 2
		}
	})
	var st *api.StatusResponse
	waitFor(t, "status on n1 lists both members", func() bool {
		st = adminStatus(t, tc.nodes[0])
		return len(st.View.GetMembers()) == 2
	})
	if st.ClusterVersion != 2 {
		t.Errorf("cluster version %d, want 2", st.ClusterVersion)
	}
	for _, m := range st.View.Members {
		if want := map[string]uint32{"n1": fsm.CurrentClusterVersion, "n2": 2}[m.Id]; m.ClusterVersion != want {
			t.Errorf("member %s: cluster version %d, want %d", m.Id, m.ClusterVersion, want)
		}
	}
}

func TestResolveClusterVersion(t *testing.T) {
	t.Setenv(maxClusterVersionEnv, "")
	c := Config{}
	if err := resolveClusterVersion(&c); err != nil || c.Cluster.MaxClusterVersion != fsm.CurrentClusterVersion {
		t.Fatalf("default: %d %v", c.Cluster.MaxClusterVersion, err)
	}
	t.Setenv(maxClusterVersionEnv, "1")
	c = Config{}
	if err := resolveClusterVersion(&c); err != nil || c.Cluster.MaxClusterVersion != 1 {
		t.Fatalf("env 1: %d %v", c.Cluster.MaxClusterVersion, err)
	}
	c = Config{Cluster: ClusterConfig{MaxClusterVersion: 2}}
	if err := resolveClusterVersion(&c); err != nil || c.Cluster.MaxClusterVersion != 2 {
		t.Fatalf("field wins over env: %d %v", c.Cluster.MaxClusterVersion, err)
	}
	for _, bad := range []string{"x", "0", strconv.Itoa(fsm.CurrentClusterVersion + 1)} {
		t.Setenv(maxClusterVersionEnv, bad)
		c = Config{}
		if err := resolveClusterVersion(&c); err == nil || !strings.Contains(err.Error(), fmt.Sprint(fsm.CurrentClusterVersion)) {
			t.Errorf("env %q: %v, want an error naming the supported range", bad, err)
		}
	}
}

// failNode makes tc.nodes[i] look crashed to the others — its gossip stops
// without a leave message — then stops the rest of it.
func failNode(t *testing.T, tc *testCluster, i int) {
	t.Helper()
	s := tc.nodes[i]
	if err := s.members.Shutdown(); err != nil {
		t.Fatalf("shut down %s's gossip: %v", s.cfg.Node.ID, err)
	}
	stop(t, s)
	tc.nodes[i] = nil
}

// waitMemberStatus waits until every live node lists id with status st.
func waitMemberStatus(t *testing.T, tc *testCluster, id, st string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("every live node sees %s %s", id, st), func() bool {
		for _, s := range tc.live() {
			seen := false
			for _, m := range s.memberList() {
				if m.ID == id && m.Status == st {
					seen = true
				}
			}
			if !seen {
				return false
			}
		}
		return true
	})
}

// setLimits sets tenant's max_series through node s, retrying while group 0
// has no reachable leader (a voter just went down); other errors return.
func setLimits(t *testing.T, s *Server, tenant string, maxSeries int) (*api.LimitsChangeResponse, error) {
	t.Helper()
	cfg := api.NewConfigClient(dial(t, s.GRPCAddr()))
	var resp *api.LimitsChangeResponse
	var err error
	waitFor(t, "a SetLimits answer other than Unavailable", func() bool {
		ctx, cancel := context.WithTimeout(adminCtx(t), 10*time.Second)
		defer cancel()
		resp, err = cfg.SetLimits(ctx, &api.SetLimitsRequest{Tenant: tenant, Set: map[string]string{"max_series": strconv.Itoa(maxSeries)}})
		if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded {
			time.Sleep(20 * time.Millisecond)
			return false
		}
		return true
	})
	return resp, err
}

// waitLimitEverywhere waits until every group replica on every live node
// holds config version v with tenant's max_series = maxSeries.
func waitLimitEverywhere(t *testing.T, tc *testCluster, tenant string, v uint64, maxSeries int64) {
	t.Helper()
	for _, s := range tc.live() {
		for g := range s.cfg.Layout.Groups {
			if !s.hostsGroup(g) {
				continue
			}
			waitFor(t, fmt.Sprintf("%s's group %d replica at config version %d", s.cfg.Node.ID, g, v), func() bool {
				return s.rcfg.mods[g].Current().Version >= v
			})
			if got := s.groupLimits(g).For(tenant).MaxSeries; got != maxSeries {
				t.Fatalf("%s group %d: %s max_series %d at config version %d, want %d",
					s.cfg.Node.ID, g, tenant, got, s.rcfg.mods[g].Current().Version, maxSeries)
			}
		}
	}
}

// A voter that is down does not block entry types it advertised before it
// went down: a runtime-config change (cluster version 3) goes through while n3
// is failed, and again while it has left gracefully.
func TestGateOpenWhileAVoterIsDown(t *testing.T) {
	var n3Cfg Config
	tc := startCluster(t, 3, func(i int, c *Config) {
		if i == 2 { // fixed addresses: n3 restarts later
			c.Node.GRPCAddr, c.Raft.Addr, c.Gossip.Addr = loopbackPort(t), loopbackPort(t), loopbackPort(t)
			n3Cfg = *c
		}
	})
	n1 := tc.nodes[0]
	if !n1.hostsGroup(0) || !tc.nodes[2].hostsGroup(0) {
		t.Fatal("n1 and n3 must both be voters of group 0 for this test")
	}

	failNode(t, tc, 2)
	waitMemberStatus(t, tc, "n3", membership.StatusFailed)
	resp, err := setLimits(t, n1, "acme", 1000)
	if err != nil {
		t.Fatalf("SetLimits with n3 failed: %v", err)
	}
	waitLimitEverywhere(t, tc, "acme", resp.Version, 1000)

	// n3 comes back (same build), catches up, then leaves gracefully.
	n3, err := New(n3Cfg)
	if err != nil {
		t.Fatalf("restart n3: %v", err)
	}
	tc.nodes[2] = n3
	tc.waitReady()
	waitMemberStatus(t, tc, "n3", membership.StatusAlive)
	waitLimitEverywhere(t, tc, "acme", resp.Version, 1000)
	stop(t, n3)
	tc.nodes[2] = nil
	waitMemberStatus(t, tc, "n3", membership.StatusLeft)
	resp2, err := setLimits(t, tc.nodes[1], "acme", 2000)
	if err != nil {
		t.Fatalf("SetLimits with n3 left: %v", err)
	}
	if resp2.Version <= resp.Version {
		t.Fatalf("second change got version %d, first %d", resp2.Version, resp.Version)
	}
	waitLimitEverywhere(t, tc, "acme", resp2.Version, 2000)
}

// A down voter whose last advertised version is below an entry type's still
// blocks that type: it may come back with that build.
func TestGateRefusesWhileADownVoterLags(t *testing.T) {
	tc := startCluster(t, 3, func(i int, c *Config) {
		if i == 2 {
			c.Cluster.MaxClusterVersion = 2 // runtime config needs 3
		}
	})
	n1 := tc.nodes[0]
	waitFor(t, "n1 sees n3 advertise cluster version 2", func() bool {
		for _, m := range n1.memberList() {
			if m.ID == "n3" && m.Status == membership.StatusAlive {
				return m.ClusterVersion == 2
			}
		}
		return false
	})
	stop(t, tc.nodes[2]) // graceful: the others see n3 left
	tc.nodes[2] = nil
	waitMemberStatus(t, tc, "n3", membership.StatusLeft)

	_, err := setLimits(t, n1, "acme", 1000)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "n3 is left and last advertised cluster version 2") {
		t.Fatalf("SetLimits while n3, last at version 2, is down: %v, want FailedPrecondition naming n3's last version", err)
	}
	for _, s := range tc.live() {
		if v := s.RuntimeConfig().Version; v != 0 {
			t.Fatalf("%s holds config version %d after a refused change", s.cfg.Node.ID, v)
		}
	}
	// Entry types n3 did advertise stay open: drop-tenant is version 2.
	trackGroup0(t, tc, "t", 1, 10)
	adm := api.NewAdminClient(dial(t, n1.GRPCAddr()))
	g := uint32(0)
	var out *api.DropTenantResponse
	waitFor(t, "a DropTenant answer other than Unavailable", func() bool {
		out, err = adm.DropTenant(adminCtx(t), &api.DropTenantRequest{Tenant: "t", Group: &g})
		return status.Code(err) != codes.Unavailable
	})
	if err != nil || out.Removed != 40 {
		t.Fatalf("DropTenant (version 2) while n3 is down: %v %v, want 40 removed", out, err)
	}
}
