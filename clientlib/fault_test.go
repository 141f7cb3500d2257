package clientlib

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// The tests in this file run against fakeNode, the scripted stand-in (see
// fake_test.go); client_test.go runs against a real single-node server.

func TestConfigDefaultsAndValidation(t *testing.T) {
	cfg := Config{Addrs: []string{"127.0.0.1:1"}}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != DefaultTimeout || cfg.RetryInitial != DefaultRetryInitial || cfg.RetryMax != DefaultRetryMax ||
		cfg.NearLimitRefresh != DefaultNearLimitRefresh || cfg.AsyncWait != DefaultAsyncWait ||
		cfg.AsyncTimeout != DefaultAsyncTimeout || cfg.Mode != ModeAuto || cfg.FailOpen || cfg.Logger == nil {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	bad := []Config{
		{},
		{Addrs: []string{""}},
		{Addrs: []string{"a"}, Partitions: 4, Groups: 5},
		{Addrs: []string{"a"}, Partitions: -1},
		{Addrs: []string{"a"}, RetryInitial: time.Second, RetryMax: time.Millisecond},
		{Addrs: []string{"a"}, AsyncWait: time.Second, AsyncTimeout: time.Millisecond},
		{Addrs: []string{"a"}, Timeout: -time.Second},
		{Addrs: []string{"a"}, Mode: 7},
	}
	for i, b := range bad {
		if _, err := New(b); err == nil {
			t.Errorf("config %d (%+v) accepted", i, b)
		}
	}
}

func TestSplitByPartition(t *testing.T) {
	const p, g = 16, 4
	var hashes []uint64
	for i := range 5 {
		for _, part := range []int{9, 2, 15, 2} {
			hashes = append(hashes, hashesIn(part, p, 5)[i]+uint64(part))
		}
	}
	parts := splitByPartition(hashes, p, api.ArithmeticTable(p, g))
	if len(parts) != 3 {
		t.Fatalf("%d parts, want 3", len(parts))
	}
	total := 0
	for i, pt := range parts {
		if i > 0 && parts[i-1].partition >= pt.partition {
			t.Errorf("parts not ascending: %d then %d", parts[i-1].partition, pt.partition)
		}
		if pt.group != api.GroupOf(pt.partition, p, g) {
			t.Errorf("partition %d: group %d", pt.partition, pt.group)
		}
		// Request order is kept inside a partition.
		var want []uint64
		for _, h := range hashes {
			if api.Partition(h, p) == pt.partition {
				want = append(want, h)
			}
		}
		if !slices.Equal(pt.hashes, want) {
			t.Errorf("partition %d: %x, want %x", pt.partition, pt.hashes, want)
		}
		total += len(pt.hashes)
	}
	if total != len(hashes) {
		t.Errorf("%d hashes split, %d given", total, len(hashes))
	}
	one := hashesIn(3, p, 4)
	if parts := splitByPartition(one, p, api.ArithmeticTable(p, g)); len(parts) != 1 || parts[0].partition != 3 || !slices.Equal(parts[0].hashes, one) {
		t.Errorf("single partition: %+v", parts)
	}
	// By a table that moved partition 9 from group 2 to group 0.
	moved := api.ArithmeticTable(p, g).Move(9, 0)
	for _, pt := range splitByPartition(hashes, p, moved) {
		if want := moved.GroupOf(pt.partition); pt.group != want || (pt.partition == 9 && pt.group != 0) {
			t.Errorf("by the moved table: partition %d routed to group %d, want %d", pt.partition, pt.group, want)
		}
	}
}

func TestNotLeaderHintFollowed(t *testing.T) {
	follower, leader := newFakeNode(t), newFakeNode(t)
	const p, g = 8, 2
	follower.setTrack(func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, notLeaderErr(api.GroupOf(int(req.Partition), p, g), leader.addr)
	})
	leader.setTrack(rejectAll)
	cfg := testConfig(follower.addr)
	cfg.Partitions, cfg.Groups = p, g
	c := newTestClient(t, cfg)

	hs := hashesIn(1, p, 3) // group 0
	rej, err := c.TrackSeries(context.Background(), "t", hs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rej, hs) {
		t.Errorf("rejected %x, want %x", rej, hs)
	}
	if got := c.Leaders()[0]; got != leader.addr {
		t.Errorf("leader table: group 0 → %q, want %q", got, leader.addr)
	}
	st := c.Stats()
	if st.NotLeaderRedirects != 1 || st.Retries != 1 || st.LeaderTableSize != 1 {
		t.Errorf("stats %+v: want 1 redirect, 1 retry, 1 known leader", st)
	}
	// The next call goes straight to the leader.
	before := follower.trackCalls.Load()
	if _, err := c.TrackSeries(context.Background(), "t", hs); err != nil {
		t.Fatal(err)
	}
	if follower.trackCalls.Load() != before {
		t.Error("second call went to the follower again")
	}
	if LeaderHint(notLeaderErr(0, "x:1")) != "x:1" || LeaderHint(errors.New("x")) != "" || LeaderHint(status.Error(codes.Unavailable, "u")) != "" {
		t.Error("LeaderHint")
	}
}

func TestUnavailableRetried(t *testing.T) {
	n := newFakeNode(t)
	var calls atomic.Int64
	n.setTrack(func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		if calls.Add(1) <= 3 {
			return nil, status.Error(codes.Unavailable, "scripted: no leader yet")
		}
		return &api.TrackSeriesResponse{RejectedHashes: req.Hashes[:1]}, nil
	})
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	c := newTestClient(t, cfg)
	hs := hashesIn(0, 4, 2)
	rej, err := c.TrackSeries(context.Background(), "t", hs)
	if err != nil || !slices.Equal(rej, hs[:1]) {
		t.Fatalf("got %x, %v", rej, err)
	}
	if st := c.Stats(); st.Retries != 3 || st.Requests != 1 {
		t.Errorf("stats %+v: want 3 retries of 1 request", st)
	}
}

func TestNonRetryableReturnedAtOnce(t *testing.T) {
	n := newFakeNode(t)
	for _, code := range []codes.Code{codes.InvalidArgument, codes.ResourceExhausted, codes.PermissionDenied} {
		n.trackCalls.Store(0)
		n.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
			return nil, status.Error(code, "scripted")
		})
		cfg := testConfig(n.addr)
		cfg.Partitions, cfg.Groups = 4, 1
		cfg.FailOpen = true // never applies to these
		c := newTestClient(t, cfg)
		_, err := c.TrackSeries(context.Background(), "t", hashesIn(2, 4, 1))
		if status.Code(err) != code {
			t.Errorf("%v: got %v", code, err)
		}
		if n.trackCalls.Load() != 1 {
			t.Errorf("%v: %d calls, want 1", code, n.trackCalls.Load())
		}
		_ = c.Close()
	}
}

// TestDeadlineRespected: a backoff longer than the deadline is never slept; the
// call ends with the last error once the deadline would pass.
func TestDeadlineRespected(t *testing.T) {
	n := newFakeNode(t)
	n.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, status.Error(codes.Unavailable, "scripted: down")
	})
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour // sleeping it would hang the test
	c := newTestClient(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.TrackSeries(ctx, "t", hashesIn(1, 4, 3))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err %v, want the last Unavailable", err)
	}
	var pe *PartitionError
	if !errors.As(err, &pe) || pe.Partition != 1 || pe.Group != 0 || pe.Attempts != 1 {
		t.Fatalf("err %#v: want a *PartitionError for partition 1 after 1 attempt", err)
	}
	if ctx.Err() != nil {
		t.Error("the call used up the whole deadline instead of stopping before a too-long backoff")
	}

	// Without a caller deadline, Config.Timeout applies.
	cfg.Timeout = 50 * time.Millisecond
	c2 := newTestClient(t, cfg)
	if _, err := c2.TrackPartition(context.Background(), "t", 1, hashesIn(1, 4, 1)); status.Code(err) != codes.Unavailable {
		t.Fatalf("Timeout: err %v", err)
	}
}

// TestDeadlineExceeded: an answer that never comes ends at the caller's deadline.
func TestDeadlineExceeded(t *testing.T) {
	n := newFakeNode(t)
	n.setTrack(func(ctx context.Context, _ *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		<-ctx.Done()
		return nil, status.Error(codes.DeadlineExceeded, "scripted: commit too slow")
	})
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 2
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	hs := append(hashesIn(0, 4, 2), hashesIn(3, 4, 2)...)
	rej, err := c.TrackSeries(ctx, "t", hs)
	if rej != nil || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %x, %v; want DeadlineExceeded", rej, err)
	}
	// Two partitions failed: a *TrackError whose every element is reachable.
	var te *TrackError
	if !errors.As(err, &te) || len(te.Failed) != 2 || te.Failed[0].Partition != 0 || te.Failed[1].Partition != 3 || te.Failed[1].Group != 1 {
		t.Fatalf("err %#v: want a *TrackError for partitions 0 and 3", err)
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "partition 0") {
		t.Errorf("status.FromError: %v, %v", st, ok)
	}
	if st := c.Stats(); st.Errors != 2 || st.FailedOpen != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestFailOpen(t *testing.T) {
	n := newFakeNode(t)
	n.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, status.Error(codes.Unavailable, "scripted: down")
	})
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	cfg.FailOpen = true
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rej, err := c.TrackSeries(ctx, "t", append(hashesIn(0, 4, 2), hashesIn(2, 4, 2)...))
	if rej != nil || err != nil {
		t.Fatalf("fail open: got %x, %v", rej, err)
	}
	if st := c.Stats(); st.FailedOpen != 2 || st.Errors != 0 || st.Retries == 0 {
		t.Errorf("stats %+v: want 2 failed open after retries", st)
	}

	// The same failure without FailOpen: an error naming group and partition,
	// with the gRPC code visible through it.
	// (A backoff longer than the deadline: one attempt, whose Unavailable is
	// the final error.)
	cfg.FailOpen = false
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	c2 := newTestClient(t, cfg)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	_, err = c2.TrackSeries(ctx2, "t", hashesIn(2, 4, 2))
	var pe *PartitionError
	if !errors.As(err, &pe) || pe.Group != 0 || pe.Partition != 2 {
		t.Fatalf("err %#v", err)
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "group 0, partition 2") {
		t.Errorf("err %v: code %v", err, status.Code(err))
	}
	if st, ok := status.FromError(err); !ok || st.Code() != codes.Unavailable {
		t.Errorf("status.FromError: %v %v", st, ok)
	}
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) || se.GRPCStatus().Code() != codes.Unavailable {
		t.Error("errors.As GRPCStatus")
	}
}

// TestAsyncLateAnswer: a tenant far from its limit is async; an answer that
// has not come within AsyncWait is dropped from the call and counted when it
// comes; its rejections mark the tenant near its limit, so the next call is sync.
func TestAsyncLateAnswer(t *testing.T) {
	n := newFakeNode(t)
	const p, g = 4, 1
	n.setNear(nearList(p, g, "other"))
	release := make(chan struct{})
	n.setTrack(func(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &api.TrackSeriesResponse{RejectedHashes: req.Hashes}, nil
	})
	cfg := testConfig(n.addr)
	cfg.Mode = ModeAuto
	cfg.Partitions, cfg.Groups = p, g
	cfg.NearLimitRefresh = time.Hour // one poll, at start
	cfg.AsyncWait = time.Millisecond
	cfg.AsyncTimeout = 20 * time.Second
	c := newTestClient(t, cfg)
	waitFor(t, "the first near-limit poll", func() bool { return !c.isSync(0, "far") })
	if !c.isSync(0, "other") {
		t.Fatal("tenant listed as near its limit is not sync")
	}

	hs := hashesIn(1, p, 4)
	rej, err := c.TrackSeries(context.Background(), "far", hs)
	if rej != nil || err != nil {
		t.Fatalf("async call: got %x, %v; want nothing (answer still pending)", rej, err)
	}
	close(release)
	waitFor(t, "the late answer", func() bool { return c.Stats().AsyncLate == 1 })
	st := c.Stats()
	if st.AsyncRequests != 1 || st.AsyncLateRejected != uint64(len(hs)) {
		t.Errorf("stats %+v", st)
	}
	// The late rejections made the tenant sync: exact answers from now on.
	if !c.isSync(0, "far") {
		t.Fatal("late rejections did not mark the tenant near its limit")
	}
	rej, err = c.TrackSeries(context.Background(), "far", hs)
	if err != nil || !slices.Equal(rej, hs) {
		t.Fatalf("sync call: got %x, %v", rej, err)
	}
	if st := c.Stats(); st.SyncRequests != 1 {
		t.Errorf("stats %+v: want 1 sync request", st)
	}
}

// TestAsyncAnswerInTime: an async answer that comes within AsyncWait is used.
func TestAsyncAnswerInTime(t *testing.T) {
	n := newFakeNode(t)
	const p, g = 4, 2
	n.setNear(nearList(p, g))
	n.setTrack(rejectAll)
	cfg := testConfig(n.addr)
	cfg.Mode = ModeAuto
	cfg.Partitions, cfg.Groups = p, g
	cfg.NearLimitRefresh = time.Hour
	cfg.AsyncWait = 10 * time.Second // the answer always comes first
	cfg.AsyncTimeout = 20 * time.Second
	c := newTestClient(t, cfg)
	waitFor(t, "the first near-limit poll", func() bool { return !c.isSync(0, "t") && !c.isSync(1, "t") })
	hs := append(hashesIn(3, p, 2), hashesIn(0, p, 2)...)
	rej, err := c.TrackSeries(context.Background(), "t", hs)
	want := append(hashesIn(0, p, 2), hashesIn(3, p, 2)...) // grouped by partition
	if err != nil || !slices.Equal(rej, want) {
		t.Fatalf("got %x, %v; want %x", rej, err, want)
	}
	if st := c.Stats(); st.AsyncRequests != 2 || st.AsyncLate != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestAsyncBackgroundFailure: an async part whose node is down returns
// nothing and no error at once; the background failure is counted.
func TestAsyncBackgroundFailure(t *testing.T) {
	n := newFakeNode(t)
	const p, g = 4, 1
	n.setNear(nearList(p, g))
	n.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, status.Error(codes.Unavailable, "scripted: down")
	})
	cfg := testConfig(n.addr)
	cfg.Mode = ModeAuto
	cfg.Partitions, cfg.Groups = p, g
	cfg.NearLimitRefresh = time.Hour
	cfg.AsyncWait = time.Millisecond
	cfg.AsyncTimeout = 100 * time.Millisecond
	c := newTestClient(t, cfg)
	waitFor(t, "the first near-limit poll", func() bool { return !c.isSync(0, "t") })
	rej, err := c.TrackSeries(context.Background(), "t", hashesIn(0, p, 2))
	if rej != nil || err != nil {
		t.Fatalf("got %x, %v", rej, err)
	}
	waitFor(t, "the background failure", func() bool { return c.Stats().AsyncLateErrors == 1 })
}

// TestWatchUpdatesLeaderTable: the leader table follows the ClusterViews, the
// layout is learned from the first view, writes go straight to leaders, and a
// broken stream is reopened.
func TestWatchUpdatesLeaderTable(t *testing.T) {
	seed, l0, l1 := newFakeNode(t), newFakeNode(t), newFakeNode(t)
	nodes := []*fakeNode{seed, l0, l1}
	cl := newFakeCluster()
	const p, g = 8, 2
	cl.set(view(p, g, nodes, []int{1, 2}))
	for _, n := range nodes {
		n.setCluster(cl)
		n.setNear(nearList(p, g))
	}
	seed.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, status.Error(codes.Internal, "scripted: the seed leads nothing and must not be asked")
	})
	var mu sync.Mutex
	got := map[string][]int{} // node → partitions received
	record := func(name string) func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
			mu.Lock()
			got[name] = append(got[name], int(req.Partition))
			mu.Unlock()
			return &api.TrackSeriesResponse{}, nil
		}
	}
	l0.setTrack(record("l0"))
	l1.setTrack(record("l1"))

	cfg := testConfig(seed.addr) // Partitions/Groups 0: learned
	c := newTestClient(t, cfg)
	if err := c.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pp, gg := c.Layout(); pp != p || gg != g {
		t.Fatalf("layout %d/%d, want %d/%d", pp, gg, p, g)
	}
	waitFor(t, "the leader table", func() bool { return slices.Equal(c.Leaders(), []string{l0.addr, l1.addr}) })
	hs := append(hashesIn(0, p, 1), hashesIn(7, p, 1)...)
	if _, err := c.TrackSeries(context.Background(), "t", hs); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if !slices.Equal(got["l0"], []int{0}) || !slices.Equal(got["l1"], []int{7}) {
		t.Errorf("writes: %v, want partition 0 on l0 and 7 on l1", got)
	}
	mu.Unlock()
	if st := c.Stats(); st.NotLeaderRedirects != 0 || st.Retries != 0 || st.LeaderTableSize != 2 || st.WatchViews == 0 {
		t.Errorf("stats %+v", st)
	}

	// Leadership of group 0 moves to l1; then group 1 loses its leader.
	cl.set(view(p, g, nodes, []int{2, 2}))
	waitFor(t, "the moved leader", func() bool { return c.Leaders()[0] == l1.addr })
	cl.set(view(p, g, nodes, []int{2, -1}))
	waitFor(t, "the lost leader", func() bool { return c.Leaders()[1] == "" })
	if st := c.Stats(); st.LeaderTableSize != 1 {
		t.Errorf("leader table size %d, want 1", st.LeaderTableSize)
	}

	// A broken stream is reopened (to another node in turn) and the new view applied.
	cl.breakStreams()
	cl.set(view(p, g, nodes, []int{1, 1}))
	waitFor(t, "a reconnect", func() bool { return c.Stats().WatchReconnects >= 1 })
	waitFor(t, "the view after reconnecting", func() bool { return slices.Equal(c.Leaders(), []string{l0.addr, l0.addr}) })
}

// TestWatchUnimplementedFallsBack: against nodes without WatchCluster the
// client assumes the default layout, routes by hints, and says so once.
func TestWatchUnimplementedFallsBack(t *testing.T) {
	a, b := newFakeNode(t), newFakeNode(t)
	p, g := api.DefaultPartitions, api.DefaultGroups
	a.setTrack(func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, notLeaderErr(api.GroupOf(int(req.Partition), p, g), b.addr)
	})
	b.setTrack(rejectAll)
	var logs syncBuffer
	cfg := testConfig(a.addr)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg.watchReprobe = time.Millisecond
	c := newTestClient(t, cfg)
	if err := c.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pp, gg := c.Layout(); pp != p || gg != g {
		t.Fatalf("layout %d/%d, want the defaults", pp, gg)
	}
	hs := hashesIn(p-1, p, 2)
	rej, err := c.TrackSeries(context.Background(), "t", hs)
	if err != nil || !slices.Equal(rej, hs) {
		t.Fatalf("got %x, %v", rej, err)
	}
	if c.Leaders()[g-1] != b.addr {
		t.Errorf("leader table %v: hint not recorded", c.Leaders())
	}
	waitFor(t, "several probes", func() bool { return a.watchCalls.Load()+b.watchCalls.Load() >= 3 })
	if n := strings.Count(logs.String(), "does not implement WatchCluster"); n != 1 {
		t.Errorf("fallback logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestLayoutMismatch(t *testing.T) {
	n := newFakeNode(t)
	cl := newFakeCluster()
	cl.set(view(64, 4, []*fakeNode{n}, []int{0, 0, 0, 0}))
	n.setCluster(cl)
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 32, 4
	cfg.FailOpen = true // a misconfiguration is never failed open
	c := newTestClient(t, cfg)
	waitFor(t, "the first view", func() bool { return c.Stats().WatchViews > 0 })
	_, err := c.TrackSeries(context.Background(), "t", []uint64{1, 2})
	var le *LayoutError
	if !errors.As(err, &le) || le.ClusterPartitions != 64 || le.ConfigPartitions != 32 {
		t.Fatalf("err %v, want a *LayoutError", err)
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "partitions=32") {
		t.Errorf("err %v", err)
	}
	if err := c.WaitReady(context.Background()); !errors.As(err, &le) {
		t.Errorf("WaitReady: %v", err)
	}
}

// TestLayoutUnknownUntilDeadline: no node reachable and no layout configured:
// the call ends at its deadline (or fails open).
func TestLayoutUnknownUntilDeadline(t *testing.T) {
	n := newFakeNode(t)
	n.srv.Stop() // nothing listens any more
	for _, failOpen := range []bool{false, true} {
		cfg := testConfig(n.addr)
		cfg.FailOpen = failOpen
		c := newTestClient(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := c.TrackSeries(ctx, "t", []uint64{1})
		cancel()
		if failOpen {
			if err != nil || c.Stats().FailedOpen != 1 {
				t.Errorf("fail open: %v, %+v", err, c.Stats())
			}
		} else if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("err %v, want DeadlineExceeded", err)
		}
	}
	// With a configured layout the call does not wait for a view that cannot
	// come: it is sent, and fails with the connection's Unavailable.
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.TrackSeries(ctx, "t", []uint64{1}); status.Code(err) != codes.Unavailable {
		t.Errorf("configured layout, node down: %v, want Unavailable", err)
	}
}

// TestNearLimitPollPrefersFollowers: with a view naming voters, the near-limit
// poll asks a replica that does not lead the group.
func TestNearLimitPollPrefersFollowers(t *testing.T) {
	leader, follower := newFakeNode(t), newFakeNode(t)
	nodes := []*fakeNode{leader, follower}
	const p, g = 4, 2
	cl := newFakeCluster()
	cl.set(view(p, g, nodes, []int{0, 0}))
	for _, n := range nodes {
		n.setCluster(cl)
		n.setNear(nearList(p, g, "hot"))
	}
	cfg := testConfig(leader.addr)
	cfg.Mode = ModeAuto
	cfg.NearLimitRefresh = 5 * time.Millisecond
	c := newTestClient(t, cfg)
	waitFor(t, "polls with the view known", func() bool { return follower.nearCalls.Load() >= 4 })
	if st := c.Stats(); st.NearLimit != 2 {
		t.Errorf("near-limit pairs %d, want 2 (hot in both groups)", st.NearLimit)
	}
	// Polls sent after the view arrived all went to the follower.
	l := leader.nearCalls.Load()
	waitFor(t, "more polls", func() bool { return follower.nearCalls.Load() >= 12 })
	if leader.nearCalls.Load() != l {
		t.Errorf("leader polled %d more times although a follower serves reads", leader.nearCalls.Load()-l)
	}
	if !c.isSync(0, "hot") || c.isSync(1, "cold") {
		t.Error("sync decision does not follow the near-limit list")
	}
}

func TestCloseAndInvalidInput(t *testing.T) {
	n := newFakeNode(t)
	cfg := testConfig(n.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	c := newTestClient(t, cfg)
	if _, err := c.TrackSeries(context.Background(), "bad tenant", []uint64{1}); status.Code(err) != codes.InvalidArgument || !errors.Is(err, api.ErrInvalidTenantID) {
		t.Errorf("bad tenant: %v", err)
	}
	if _, err := c.TrackPartition(context.Background(), "t", 4, []uint64{1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad partition: %v", err)
	}
	if rej, err := c.TrackSeries(context.Background(), "t", nil); rej != nil || err != nil {
		t.Errorf("empty: %v %v", rej, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	_, err := c.TrackSeries(context.Background(), "t", []uint64{1})
	if !errors.Is(err, ErrClosed) || status.Code(err) != codes.Canceled {
		t.Errorf("after Close: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAttemptTimeoutMovesOn: a node that never answers (a leader cut off by a
// partition drops packets) costs one AttemptTimeout, not the call's deadline;
// the client then goes through another node.
func TestAttemptTimeoutMovesOn(t *testing.T) {
	silent, healthy := newFakeNode(t), newFakeNode(t)
	silent.setTrack(func(ctx context.Context, _ *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		<-ctx.Done() // blackholed: no answer until the client gives up
		return nil, ctx.Err()
	})
	// The node list is tried round-robin starting at index 1: the silent node first.
	cfg := testConfig(healthy.addr, silent.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	// Generous for a loaded machine: a healthy attempt that also times out is
	// retried, which only costs time; the property is that the call succeeds
	// well before its deadline although the silent node never answers.
	cfg.AttemptTimeout = 500 * time.Millisecond
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rej, err := c.TrackSeries(ctx, "t", hashesIn(2, 4, 3))
	if err != nil || len(rej) != 0 {
		t.Fatalf("got %x, %v; want success through the healthy node", rej, err)
	}
	if silent.trackCalls.Load() < 1 || healthy.trackCalls.Load() < 1 {
		t.Fatalf("calls: silent %d, healthy %d; want the silent node tried first, then the healthy one",
			silent.trackCalls.Load(), healthy.trackCalls.Load())
	}
	if st := c.Stats(); st.AttemptTimeouts < 1 || st.Retries < 1 {
		t.Errorf("stats %+v: want at least 1 attempt timeout and 1 retry", st)
	}
}

// TestAsyncPartsNeverSurfaceBehindSlowSync: in ModeAuto a call whose sync
// part (a group where the tenant is near its limit) answers only after the
// async parts' background deadline (AsyncTimeout) has passed. The async
// parts, whose group keeps answering Unavailable, timed out in the
// background meanwhile; they must not come back as the call's error (nor, with
// FailOpen, as fail-open decisions): only the sync part decides the answer,
// and the dropped background failures are counted as late errors.
func TestAsyncPartsNeverSurfaceBehindSlowSync(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failopen=%v", failOpen), func(t *testing.T) {
			n := newFakeNode(t)
			const p, g = 4, 2 // partitions 0-1: group 0; 2-3: group 1
			n.setNear(func(req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
				grp := api.GroupOf(int(req.Partition), p, g)
				var near []string
				if grp == 0 {
					near = []string{"t"} // sync in group 0, async in group 1
				}
				return &api.GetUsersCloseToLimitResponse{Tenants: near, Group: uint32(grp)}, nil
			})
			n.setTrack(func(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
				if api.GroupOf(int(req.Partition), p, g) == 1 {
					return nil, status.Error(codes.Unavailable, "scripted: group 1 has no leader")
				}
				// The sync part answers after the async parts' deadline.
				select {
				case <-time.After(600 * time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return &api.TrackSeriesResponse{RejectedHashes: req.Hashes[:1]}, nil
			})
			cfg := testConfig(n.addr)
			cfg.Mode = ModeAuto
			cfg.FailOpen = failOpen
			cfg.Partitions, cfg.Groups = p, g
			cfg.NearLimitRefresh = time.Hour
			cfg.AsyncWait = 50 * time.Millisecond
			cfg.AsyncTimeout = 150 * time.Millisecond
			cfg.AttemptTimeout = 5 * time.Second
			c := newTestClient(t, cfg)
			waitFor(t, "the first near-limit poll", func() bool { return c.isSync(0, "t") && !c.isSync(1, "t") })
			hs := append(append(hashesIn(0, p, 3), hashesIn(2, p, 3)...), hashesIn(3, p, 3)...)
			rej, err := c.TrackSeries(context.Background(), "t", hs)
			if err != nil {
				t.Fatalf("call failed with a background part's failure: %v", err)
			}
			if want := hashesIn(0, p, 1); !slices.Equal(rej, want) {
				t.Errorf("rejected %x, want the sync part's %x", rej, want)
			}
			st := c.Stats()
			if st.FailedOpen != 0 || st.Errors != 0 {
				t.Errorf("stats %+v: a background part became a fail-open decision or an error", st)
			}
			waitFor(t, "both background failures counted", func() bool { return c.Stats().AsyncLateErrors == 2 })
		})
	}
}

// TestLeaderHintResetsBackoff: a group whose leadership moves while a call
// retries. Node A answers Unavailable five times (an election), which grows
// the backoff; then it names B as the new leader, and B answers Unavailable
// once more (it is still taking over) before it answers. The leader learned
// from A's answer is progress: the wait after B's Unavailable starts again
// from RetryInitial instead of continuing the doubling (the earlier client
// waited 16–32 ms there, and with dense moves every such wait stacked up to
// seconds per call). Asserted on the waits the client asked for, not on time.
func TestLeaderHintResetsBackoff(t *testing.T) {
	a, b := newFakeNode(t), newFakeNode(t)
	var aCalls, bCalls atomic.Int64
	a.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		if aCalls.Add(1) <= 5 {
			return nil, status.Error(codes.Unavailable, "scripted: electing")
		}
		return nil, notLeaderErr(0, b.addr)
	})
	b.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		if bCalls.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "scripted: taking over")
		}
		return &api.TrackSeriesResponse{}, nil
	})
	cfg := testConfig(a.addr)
	cfg.Partitions, cfg.Groups = 4, 1
	cfg.RetryInitial, cfg.RetryMax = time.Millisecond, time.Second
	c := newTestClient(t, cfg)
	var mu sync.Mutex
	var waits []time.Duration
	c.onBackoff = func(d time.Duration) { mu.Lock(); waits = append(waits, d); mu.Unlock() }
	if _, err := c.TrackPartition(context.Background(), "t", 0, hashesIn(0, 4, 2)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) < 6 || bCalls.Load() != 2 {
		t.Fatalf("waits %v, calls to B %d: want 5 waits while A elects, then one after B's Unavailable", waits, bCalls.Load())
	}
	// waits[5] follows B's Unavailable, the first failure after the hint.
	if w := waits[5]; w > cfg.RetryInitial {
		t.Errorf("after learning the new leader the client waited %v (waits %v); want at most RetryInitial %v", w, waits, cfg.RetryInitial)
	}
}

// TestRetryWakesOnNewLeader: a request whose group has no leader waits out
// a backoff (here RetryInitial is 10 minutes, so the wait is at least 5);
// when the cluster watch names the new leader, the wait ends at once and the
// request goes there. Asserted by completion, not by time: on the earlier
// client the call would still be asleep when the test gives up.
func TestRetryWakesOnNewLeader(t *testing.T) {
	seed, l := newFakeNode(t), newFakeNode(t)
	nodes := []*fakeNode{seed, l}
	cl := newFakeCluster()
	const p, g = 4, 1
	cl.set(view(p, g, nodes, []int{-1})) // no leader yet
	for _, n := range nodes {
		n.setCluster(cl)
	}
	seed.setTrack(func(context.Context, *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		return nil, status.Error(codes.Unavailable, "scripted: group 0 has no leader at the moment")
	})
	var leads atomic.Bool
	l.setTrack(func(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		if !leads.Load() {
			return nil, status.Error(codes.Unavailable, "scripted: still electing")
		}
		return rejectAll(ctx, req)
	})
	cfg := testConfig(seed.addr)
	cfg.Timeout = time.Hour
	cfg.RetryInitial, cfg.RetryMax = 10*time.Minute, 10*time.Minute
	c := newTestClient(t, cfg)
	if err := c.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	hs := hashesIn(1, p, 3)
	type res struct {
		rej []uint64
		err error
	}
	done := make(chan res, 1)
	go func() {
		rej, err := c.TrackPartition(context.Background(), "t", 1, hs)
		done <- res{rej, err}
	}()
	waitFor(t, "the first attempt to fail", func() bool { return seed.trackCalls.Load()+l.trackCalls.Load() >= 1 })
	// Let the failed answer come back and the backoff (≥ 5 min) start;
	// only the order matters here, the margin is generous.
	time.Sleep(300 * time.Millisecond)
	leads.Store(true)
	cl.set(view(p, g, nodes, []int{1})) // the election is over: l leads
	select {
	case r := <-done:
		if r.err != nil || !slices.Equal(r.rej, hs) {
			t.Fatalf("got %x, %v; want every hash rejected by the new leader", r.rej, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the request still waits out its backoff after the new leader became known")
	}
	if st := c.Stats(); st.LeaderWakes != 1 {
		t.Errorf("stats %+v: want 1 leader wake", st)
	}
}
