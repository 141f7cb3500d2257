package server

import (
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
)

// sumShares adds every group's share of tenant as node s's replicas see them,
// plus the headroom in transit (given, not yet received).
func sumShares(s *Server, tenant string) (sum, inTransit int64) {
	for g := range s.cfg.Groups {
		v := s.shares.tenantShares(g, tenant)
		sum += v.Share
		for _, o := range v.Outstanding {
			if !s.shares.mods[o.To].Received(tenant, g, o.Seq) {
				inTransit += o.Amount
			}
		}
	}
	return sum, inTransit
}

// randomFill sends n random new series of tenant, one partition per request,
// and returns how many were rejected.
func randomFill(t *testing.T, c api.TrackerClient, tenant string, seed uint64, n, batch int) int {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	rejected := 0
	for sent := 0; sent < n; {
		part := r.IntN(64)
		k := min(batch, n-sent)
		hs := hashesIn(r.Uint64(), part, k)
		rejected += len(track(t, c, tenant, part, hs))
		sent += k
	}
	return rejected
}

// On one node with 4 groups, a tenant is rejected only at its tenant-wide
// limit: 64 random series all go in (the static split rejects some), the
// 65th is rejected, and the shares still sum to the limit. The node runs
// the default share mode, which must be movable.
func TestMovableSharesExactAtLimit(t *testing.T) {
	s, c := startServer(t, t.TempDir(), func(c *Config) { c.DefaultMaxSeries = 64 })
	if s.cfg.ShareMode != ShareMovable {
		t.Fatalf("default share mode %q, want %q", s.cfg.ShareMode, ShareMovable)
	}
	defer stop(t, s)
	for seed := range uint64(5) {
		tenant := "t" + string(rune('a'+seed))
		if rej := randomFill(t, c, tenant, seed, 64, 1); rej != 0 {
			t.Fatalf("%s: %d of 64 series rejected below the limit", tenant, rej)
		}
		if rej := randomFill(t, c, tenant, seed+100, 10, 1); rej != 10 {
			t.Fatalf("%s: %d of 10 series beyond the limit rejected, want 10", tenant, rej)
		}
		var active int64
		for g := range 4 {
			a, _ := s.FSM(g).TenantUsage(tenant)
			active += a
		}
		if active != 64 {
			t.Fatalf("%s: %d active, want 64", tenant, active)
		}
		if sum, tr := sumShares(s, tenant); sum+tr != 64 || sum > 64 {
			t.Fatalf("%s: Σ shares %d + in transit %d, want 64", tenant, sum, tr)
		}
	}
}

// The static mode keeps today's split (the benchmark baseline): a group
// stops at ceil(64·16/64) = 16.
func TestStaticShareMode(t *testing.T) {
	s, c := startServer(t, t.TempDir(), func(c *Config) { c.ShareMode = ShareStatic })
	defer stop(t, s)
	if rej := track(t, c, "t", 0, hashesIn(1, 0, 20)); len(rej) != 4 {
		t.Fatalf("static: %d rejected, want 4", len(rej))
	}
	if _, err := New(Config{ShareMode: "bogus"}); err == nil {
		t.Fatal("bad share mode accepted")
	}
}

// Across three nodes (group leaders spread, borrows go over gRPC with the
// admin token), random filling to the limit is exact; after the leader of a
// group that gave headroom is stopped, a transfer left outstanding is
// delivered and Σ shares stays equal to the limit.
func TestMovableSharesCluster(t *testing.T) {
	tc := startCluster(t, 3, func(_ int, c *Config) { c.DefaultMaxSeries = 300; c.ShareMode = ShareMovable })
	leaders := map[string]bool{}
	for g := range 4 {
		leaders[tc.leader(g).cfg.NodeID] = true
	}
	s := tc.leader(0)
	clients := map[int]api.TrackerClient{}
	for g := range 4 {
		clients[g] = api.NewTrackerClient(dial(t, tc.leader(g).GRPCAddr()))
	}
	r := rand.New(rand.NewPCG(9, 9))
	rejected := 0
	for i := 0; i < 300; i++ {
		part := r.IntN(64)
		g := api.GroupOf(part, 64, 4)
		rejected += len(track(t, clients[g], "tenant", part, hashesIn(r.Uint64(), part, 1)))
	}
	if rejected != 0 {
		t.Fatalf("%d of 300 rejected below the limit (leaders on %d nodes)", rejected, len(leaders))
	}
	for i := 0; i < 20; i++ {
		part := r.IntN(64)
		g := api.GroupOf(part, 64, 4)
		if rej := track(t, clients[g], "tenant", part, hashesIn(r.Uint64(), part, 1)); len(rej) != 1 {
			t.Fatal("series beyond the limit accepted")
		}
	}
	// Every transfer completes (the receiver's Complete, or the re-drive).
	waitFor(t, "no outstanding transfers", func() bool {
		for _, n := range tc.live() {
			for g := range 4 {
				if n.Raft(g).State() == raft.Leader && len(n.shares.mods[g].Outstanding()) > 0 {
					return false
				}
			}
		}
		return true
	})
	if sum, tr := sumShares(s, "tenant"); sum+tr != 300 {
		t.Fatalf("Σ shares %d + in transit %d ≠ 300", sum, tr)
	}
}
