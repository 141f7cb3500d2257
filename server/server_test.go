package server

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// testClock is an injectable wall clock.
type testClock struct{ unix atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.unix.Store(1_750_000_000)
	return c
}
func (c *testClock) Now() time.Time          { return time.Unix(c.unix.Load(), 0) }
func (c *testClock) Advance(d time.Duration) { c.unix.Add(int64(d / time.Second)) }

func startServer(t *testing.T, dir string, mod func(*Config)) (*Server, api.TrackerClient) {
	t.Helper()
	cfg := Config{
		Node:    NodeConfig{ID: "n1", DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster: ClusterConfig{Bootstrap: true},
		Raft: RaftConfig{
			Addr: "127.0.0.1:0",
			// A single voter elects itself one heartbeat timeout after start:
			// 400–800 ms with raftnode's defaults, most of a single-node test's
			// time. Short timers cost nothing here (no peers: no spurious
			// elections, the lease needs no follower); the defaults are covered
			// by raftnode's tests and by every multi-node cluster test.
			HeartbeatTimeout:   50 * time.Millisecond,
			ElectionTimeout:    50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond,
		},
		Tracking: TrackingConfig{DefaultMaxSeries: 64}, // group share 16 with P=64, G=4 (static ceil(64·16/64), movable base before moves)
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		s.Stop(context.Background())
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return s, api.NewTrackerClient(cc)
}

// staticShares keeps a group's share fixed (ceil(max·n/P)): tests of one
// group's share enforcement. Movable shares: shares_test.go.
func staticShares(c *Config) { c.Shares.Mode = ShareStatic }

func stop(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// hashesIn returns n distinct pseudo-random hashes of one partition.
func hashesIn(seed uint64, part, n int) []uint64 {
	r := rand.New(rand.NewPCG(seed, uint64(part)))
	first, last := api.PartitionHashRange(part, 64)
	seen := map[uint64]bool{}
	var out []uint64
	for len(out) < n {
		h := first + r.Uint64N(last-first)
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

func track(t *testing.T, c api.TrackerClient, tenant string, part int, hs []uint64) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(part), Hashes: hs})
	if err != nil {
		t.Fatalf("TrackSeries(%s, partition %d, %d hashes): %v", tenant, part, len(hs), err)
	}
	return resp.RejectedHashes
}

func TestLimitExactlyAtGroupShare(t *testing.T) {
	s, c := startServer(t, t.TempDir(), staticShares) // one group's fixed share
	defer stop(t, s)
	// Partitions 0..15 form group 0; the tenant's share there is 16.
	a := hashesIn(1, 0, 10)
	b := hashesIn(2, 5, 10)
	if rej := track(t, c, "t1", 0, a); len(rej) != 0 {
		t.Fatalf("first 10 rejected %d", len(rej))
	}
	rej := track(t, c, "t1", 5, b)
	// In request order: 6 more fit the share of 16, the last 4 are rejected.
	if !slices.Equal(rej, b[6:]) {
		t.Fatalf("rejected %d hashes %x, want the last 4 of the request", len(rej), rej)
	}
	if got := s.FSM(0).TenantActive("t1"); got != 16 {
		t.Fatalf("group 0 holds %d series, want exactly the share 16", got)
	}
	// Re-sending everything: the accepted 16 stay accepted, the rest stay out.
	if rej := track(t, c, "t1", 0, a); len(rej) != 0 {
		t.Fatalf("accepted series rejected on re-send: %x", rej)
	}
	if rej := track(t, c, "t1", 5, b); !slices.Equal(rej, b[6:]) {
		t.Fatalf("re-send rejected %x, want %x", rej, b[6:])
	}
	// Another group's share is independent; another tenant's too.
	if rej := track(t, c, "t1", 20, hashesIn(3, 20, 16)); len(rej) != 0 {
		t.Fatalf("group 1 rejected %d of 16", len(rej))
	}
	if rej := track(t, c, "t2", 0, hashesIn(4, 0, 16)); len(rej) != 0 {
		t.Fatalf("tenant t2 rejected %d of 16", len(rej))
	}
	// Duplicates inside one request count once.
	d := hashesIn(5, 1, 1)
	if rej := track(t, c, "t3", 1, []uint64{d[0], d[0], d[0]}); len(rej) != 0 {
		t.Fatalf("duplicates rejected: %x", rej)
	}
	if got := s.FSM(0).TenantActive("t3"); got != 1 {
		t.Fatalf("duplicate hash counted %d times", got)
	}
}

func TestConcurrentRequestsNeverExceedShare(t *testing.T) {
	s, c := startServer(t, t.TempDir(), func(c *Config) { c.Tracking.DefaultMaxSeries = 6400; c.Shares.Mode = ShareStatic }) // share 1600
	defer stop(t, s)
	type res struct {
		hs, rej []uint64
	}
	out := make(chan res, 40)
	for w := 0; w < 40; w++ {
		go func() {
			hs := hashesIn(uint64(100+w), w%16, 100)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := c.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: "load", Partition: uint32(w % 16), Hashes: hs})
			if err != nil {
				t.Error(err)
				out <- res{}
				return
			}
			out <- res{hs, resp.RejectedHashes}
		}()
	}
	accepted := map[uint64]bool{}
	for i := 0; i < 40; i++ {
		r := <-out
		rejected := map[uint64]bool{}
		for _, h := range r.rej {
			rejected[h] = true
		}
		for _, h := range r.hs {
			if !rejected[h] {
				accepted[h] = true
			}
		}
	}
	if len(accepted) != 1600 {
		t.Fatalf("accepted %d distinct series of 4000 offered, want exactly the share 1600", len(accepted))
	}
	if got := s.FSM(0).TenantActive("load"); got != 1600 {
		t.Fatalf("FSM holds %d", got)
	}
	// Every accepted series is accepted again.
	for part := 0; part < 16; part++ {
		var hs []uint64
		for h := range accepted {
			if api.Partition(h, 64) == part {
				hs = append(hs, h)
			}
		}
		if rej := track(t, c, "load", part, hs); len(rej) != 0 {
			t.Fatalf("partition %d: %d accepted series rejected on re-send", part, len(rej))
		}
	}
}

func TestAcceptedSurvivesRestartAndLowerLimit(t *testing.T) {
	dir := t.TempDir()
	limits := filepath.Join(dir, "limits.yaml")
	writeLimits := func(maxSeries int) {
		data := fmt.Sprintf("defaults:\n  max_series: 6400\ntenants:\n  t1:\n    max_series: %d\n", maxSeries)
		tmp := limits + ".tmp"
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, limits); err != nil {
			t.Fatal(err)
		}
	}
	writeLimits(400) // share 100 in each group
	// A still wall clock: the group's minute does not move, so no expiry
	// entry lands while the test compares state images across the restart.
	clk := newTestClock()
	mod := func(c *Config) {
		c.Limits.File = limits
		c.Limits.Reload = 20 * time.Millisecond
		c.Clock.Now = clk.Now
	}
	s, c := startServer(t, filepath.Join(dir, "data"), mod)
	acc := hashesIn(9, 3, 80)
	if rej := track(t, c, "t1", 3, acc); len(rej) != 0 {
		t.Fatalf("rejected %d", len(rej))
	}
	// Force a raft snapshot of group 0 so the restart restores from it, then log more.
	if err := s.Raft(0).Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	more := hashesIn(10, 4, 10)
	if rej := track(t, c, "t1", 4, more); len(rej) != 0 {
		t.Fatalf("rejected %d", len(rej))
	}
	acc = append(acc, more...)
	// The state images are taken once the node has stopped: the FSM is not
	// safe to read while raft applies (the leader's expiry ticker can append
	// an entry at any moment), and the images must be the state the restart
	// recovers, including such an entry.
	stop(t, s)
	var before [4][]byte
	for g := range before {
		before[g] = snapshotOf(t, s, g)
	}

	s, c = startServer(t, filepath.Join(dir, "data"), mod)
	defer stop(t, s)
	for g := range before {
		if got := snapshotOf(t, s, g); string(got) != string(before[g]) {
			t.Fatalf("group %d: state after restart differs from before (%d vs %d bytes)", g, len(got), len(before[g]))
		}
	}
	if rej := track(t, c, "t1", 3, acc[:80]); len(rej) != 0 {
		t.Fatalf("after restart %d accepted series rejected", len(rej))
	}
	// Lower the limit far below usage: accepted series stay, new ones are refused.
	writeLimits(4) // share 1
	// The changed file is proposed as the runtime config and reaches every
	// group's replica.
	waitFor(t, "limits reload", func() bool {
		for g := range 4 {
			if s.groupLimits(g).For("t1").MaxSeries != 4 {
				return false
			}
		}
		return true
	})
	if rej := track(t, c, "t1", 4, acc[80:]); len(rej) != 0 {
		t.Fatalf("after lowering the limit %d accepted series rejected", len(rej))
	}
	fresh := hashesIn(11, 5, 3)
	if rej := track(t, c, "t1", 5, fresh); len(rej) != 3 {
		t.Fatalf("new series over the lowered limit: %d of 3 rejected", len(rej))
	}
}

// snapshotOf returns a group's quiescent state image (its applied index included).
func snapshotOf(t *testing.T, s *Server, g int) []byte {
	t.Helper()
	var buf bytesBuffer
	if err := s.FSM(g).WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return stripIndex(buf.b)
}

func TestIdleExpiryWithInjectedClock(t *testing.T) {
	clk := newTestClock()
	s, c := startServer(t, t.TempDir(), func(c *Config) {
		c.Clock.Now = clk.Now
		c.Tracking.IdleTimeout = 20 * time.Minute
		c.Shares.Mode = ShareStatic
	})
	defer stop(t, s)
	old := hashesIn(20, 0, 16)
	if rej := track(t, c, "t1", 0, old); len(rej) != 0 {
		t.Fatal("rejected")
	}
	newer := hashesIn(21, 0, 1)
	if rej := track(t, c, "t1", 0, newer); len(rej) != 1 {
		t.Fatal("tenant at share accepted a 17th series")
	}
	clk.Advance(10 * time.Minute)
	// Refresh half of them at +10m.
	if rej := track(t, c, "t1", 0, old[:8]); len(rej) != 0 {
		t.Fatal("refresh rejected")
	}
	clk.Advance(11 * time.Minute) // the other half is now idle for 21 minutes
	waitFor(t, "idle series expired", func() bool { return s.FSM(0).TenantActive("t1") == 8 })
	if rej := track(t, c, "t1", 0, newer); len(rej) != 0 {
		t.Fatal("room freed by expiry not reused")
	}
	if rej := track(t, c, "t1", 0, old[:8]); len(rej) != 0 {
		t.Fatal("refreshed series rejected")
	}
}

func TestBadInputCodes(t *testing.T) {
	s, c := startServer(t, t.TempDir(), func(c *Config) { c.Tracking.MaxHashesPerRequest = 10 })
	defer stop(t, s)
	ctx := context.Background()
	cases := []struct {
		name string
		req  *api.TrackSeriesRequest
	}{
		{"empty tenant", &api.TrackSeriesRequest{Tenant: "", Partition: 0, Hashes: hashesIn(1, 0, 1)}},
		{"bad tenant charset", &api.TrackSeriesRequest{Tenant: "a/b", Partition: 0, Hashes: hashesIn(1, 0, 1)}},
		{"partition out of range", &api.TrackSeriesRequest{Tenant: "t", Partition: 64, Hashes: hashesIn(1, 0, 1)}},
		{"hash in another partition", &api.TrackSeriesRequest{Tenant: "t", Partition: 1, Hashes: hashesIn(1, 0, 1)}},
		{"too many hashes", &api.TrackSeriesRequest{Tenant: "t", Partition: 0, Hashes: hashesIn(1, 0, 11)}},
	}
	for _, tc := range cases {
		_, err := c.TrackSeries(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, err)
		}
	}
	if _, err := c.GetUsersCloseToLimit(ctx, &api.GetUsersCloseToLimitRequest{Partition: 99}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GetUsersCloseToLimit bad partition: %v", err)
	}
	// A valid empty request is fine.
	if _, err := c.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: "t", Partition: 0}); err != nil {
		t.Errorf("empty request: %v", err)
	}
}

func TestUsersCloseToLimit(t *testing.T) {
	s, c := startServer(t, t.TempDir(), nil) // share 16, near-limit 0.85 → ≥ 13.6
	defer stop(t, s)
	track(t, c, "near", 0, hashesIn(1, 0, 14))
	track(t, c, "far", 0, hashesIn(2, 0, 5))
	resp, err := c.GetUsersCloseToLimit(context.Background(), &api.GetUsersCloseToLimitRequest{Partition: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Tenants, []string{"near"}) || resp.Group != 0 {
		t.Fatalf("close to limit: %+v", resp)
	}
}

func TestLayoutIsFixed(t *testing.T) {
	dir := t.TempDir()
	s, _ := startServer(t, dir, nil)
	stop(t, s)
	_, err := New(Config{Node: NodeConfig{ID: "n1", DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"}, Layout: LayoutConfig{Partitions: 32}, Raft: RaftConfig{Addr: "127.0.0.1:0"}})
	if err == nil {
		t.Fatal("node started with a different partition count than its data")
	}
	// The refusal must be the layout check naming both layouts, not any other
	// start-up failure (a busy port would also make New fail).
	if msg := err.Error(); !strings.Contains(msg, "partitions=64") || !strings.Contains(msg, "partitions=32") || !strings.Contains(msg, "layout is fixed") {
		t.Fatalf("want the layout mismatch named, got: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // generous: only catches hangs
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
