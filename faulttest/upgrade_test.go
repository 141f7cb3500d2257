package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/checker"
)

// maxClusterVersionEnv makes a current binary behave like the previous build
// (cluster version 1: it does not know drop-tenant entries). Processes inherit
// the test's environment, so nodes started while it is set are "old".
const maxClusterVersionEnv = "TOLLGATE_MAX_CLUSTER_VERSION"

// TestRollingUpgrade: three nodes start as the old build (cluster version 1)
// under the checker's load. A drop-tenant (cluster version 2) is refused with
// FailedPrecondition naming a lagging node; each node in turn is stopped with
// SIGTERM and restarted as the new build while load continues, and drop-tenant
// keeps being refused while any node is old. Once all are new it succeeds.
// The checker's invariants hold (0 acknowledged series lost), and every
// replica of every group ends with the same series count and applied index.
func TestRollingUpgrade(t *testing.T) {
	t.Setenv(maxClusterVersionEnv, "1")
	c := newCluster(t, defaultClusterOptions())
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")

	// The tenant to drop is not one the checker writes: dropping removes
	// acknowledged series on purpose.
	const victim = "t-upgrade-drop"
	const perGroup = 200
	for g := range groups {
		lo, _ := api.GroupRange(g, partitions, groups)
		trackUntilOK(t, c, victim, lo, hashesOf(lo, perGroup))
	}
	loadFor(2 * time.Second)

	old := []string{"node-1", "node-2", "node-3"}
	expectRefused(t, c, victim, old)

	// Nodes started from here on run the new build.
	if err := os.Unsetenv(maxClusterVersionEnv); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		t.Logf("upgrade: stopping %s (leaders: %s)", n.id, c.describe())
		n.term(t)
		ck.waitProgress("SIGTERM of " + n.id)
		n.restart(t)
		c.waitHealthy()
		ck.waitProgress("upgrade of " + n.id)
		old = slices.DeleteFunc(old, func(id string) bool { return id == n.id })
		if i < len(c.nodes)-1 {
			expectRefused(t, c, victim, old)
		}
		loadFor(2 * time.Second)
	}

	// Every node is new: the drop goes through once the gossiped versions say so.
	var resp *api.DropTenantResponse
	start := time.Now()
	for {
		ctx, cancel := adminCtx(context.Background(), 20*time.Second)
		var err error
		resp, err = c.admin(c.nodes[0]).DropTenant(ctx, &api.DropTenantRequest{Tenant: victim})
		cancel()
		if err == nil {
			break
		}
		if code := status.Code(err); (code != codes.FailedPrecondition && code != codes.Unavailable) || time.Since(start) > leaderTimeout {
			t.Fatalf("DropTenant after the upgrade: %v", err)
		}
		t.Logf("DropTenant after the upgrade: %v (retrying)", err)
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("drop-tenant after the upgrade: %d series removed (%v)", resp.Removed, resp.Groups)
	if resp.Removed != groups*perGroup || len(resp.Groups) != groups {
		t.Errorf("drop-tenant removed %d series in %d groups, want %d in %d", resp.Removed, len(resp.Groups), groups*perGroup, groups)
	}

	ck.finish()
	checkConverged(t, c, victim)
}

// hashesOf returns n distinct hashes of partition p.
func hashesOf(p, n int) []uint64 {
	first, last := api.PartitionHashRange(p, partitions)
	step := (last - first) / uint64(n+1)
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i+1)*step
	}
	return out
}

// trackUntilOK sends one TrackSeries, following leader hints, until a node
// accepts it; every hash must be accepted.
func trackUntilOK(t *testing.T, c *cluster, tenant string, p int, hs []uint64) {
	t.Helper()
	req := &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(p), Hashes: hs}
	addr := c.nodes[0].grpcAddr
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := api.NewTrackerClient(c.conn(addr)).TrackSeries(ctx, req)
		cancel()
		if err == nil {
			if len(resp.RejectedHashes) > 0 {
				t.Fatalf("tenant %s: %d of %d series rejected below the limit", tenant, len(resp.RejectedHashes), len(hs))
			}
			return
		}
		if time.Since(start) > progressTimeout {
			t.Fatalf("TrackSeries(%s, partition %d): %v", tenant, p, err)
		}
		if nl := checker.NotLeader(err); nl != nil && nl.LeaderGrpcAddress != "" {
			addr = nl.LeaderGrpcAddress
			continue
		}
		addr = c.nodes[rand.IntN(len(c.nodes))].grpcAddr
		time.Sleep(50 * time.Millisecond)
	}
}

// expectRefused asks a random node to drop tenant and wants FailedPrecondition
// naming one of the old nodes as supporting cluster version 1; nothing may
// have been dropped.
func expectRefused(t *testing.T, c *cluster, tenant string, old []string) {
	t.Helper()
	start := time.Now()
	for {
		via := c.nodes[rand.IntN(len(c.nodes))]
		ctx, cancel := adminCtx(context.Background(), 20*time.Second)
		_, err := c.admin(via).DropTenant(ctx, &api.DropTenantRequest{Tenant: tenant})
		cancel()
		if err == nil {
			t.Fatalf("DropTenant via %s succeeded while %v run cluster version 1", via.id, old)
		}
		if status.Code(err) == codes.FailedPrecondition {
			named := false
			for _, id := range old {
				named = named || strings.Contains(err.Error(), id+" supports cluster version 1")
			}
			if !named {
				t.Fatalf("DropTenant via %s: %v; want it to name one of %v as supporting cluster version 1", via.id, err, old)
			}
			t.Logf("DropTenant via %s refused as expected: %v", via.id, status.Convert(err).Message())
			return
		}
		// Unavailable: a leader moving; the refusal must come once it settles.
		if time.Since(start) > leaderTimeout {
			t.Fatalf("DropTenant via %s: %v, want FailedPrecondition", via.id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkConverged waits (bounded) until every replica of every group reports
// the same applied index and series count at one moment, every node is ready
// (no halted group), and no replica holds a series of the dropped tenant.
func checkConverged(t *testing.T, c *cluster, dropped string) {
	t.Helper()
	start := time.Now()
	last := ""
	for {
		if last = divergence(c, dropped); last == "" {
			t.Logf("converged: every replica of every group agrees on applied index and series count")
			return
		}
		if time.Since(start) > healthyTimeout {
			t.Fatalf("replicas diverge after %v: %s", healthyTimeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func divergence(c *cluster, dropped string) string {
	ngs := c.nodeGroups()
	for g := range groups {
		var ref *api.GroupState
		var refNode string
		for _, n := range c.nodes {
			gs := groupState(ngs[n], g)
			if gs == nil {
				return fmt.Sprintf("%s reports nothing for group %d", n.id, g)
			}
			if ref == nil {
				ref, refNode = gs, n.id
				continue
			}
			if gs.AppliedIndex != ref.AppliedIndex || gs.Series != ref.Series {
				return fmt.Sprintf("group %d: %s applied %d series %d, %s applied %d series %d",
					g, refNode, ref.AppliedIndex, ref.Series, n.id, gs.AppliedIndex, gs.Series)
			}
		}
	}
	for _, n := range c.nodes {
		base := "http://" + httpAddr(n)
		body, code, err := httpGet(base + "/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Sprintf("%s /readyz: %d %s %v", n.id, code, body, err)
		}
		body, _, err = httpGet(base + "/api/v1/tenants/" + dropped)
		if err != nil {
			return fmt.Sprintf("%s tenant usage: %v", n.id, err)
		}
		var u struct {
			Series int64 `json:"series"`
		}
		if err := json.Unmarshal([]byte(body), &u); err != nil || u.Series != 0 {
			return fmt.Sprintf("%s: dropped tenant %s: %s (%v)", n.id, dropped, body, err)
		}
	}
	return ""
}

func httpAddr(n *node) string {
	for i, a := range n.args {
		if a == "--http-addr" && i+1 < len(n.args) {
			return n.args[i+1]
		}
	}
	return ""
}

func httpGet(url string) (string, int, error) {
	cl := &http.Client{Timeout: adminCallTO}
	resp, err := cl.Get(url)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), resp.StatusCode, err
}
