package clientlib

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// fakeNode is a scripted stand-in for a Tollgate node: an api.TrackerServer
// served by a real gRPC server on loopback. Tests use it to inject what a
// single real node cannot produce on demand — NotLeader redirects to another
// node, Unavailable streaks, answers that never come or come late, broken or
// unimplemented WatchCluster streams — and to count which node got which call.
type fakeNode struct {
	api.UnimplementedTrackerServer
	addr string
	srv  *grpc.Server

	mu      sync.Mutex
	onTrack func(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error)
	onNear  func(req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error)
	cluster *fakeCluster // nil: WatchCluster is Unimplemented

	trackCalls, nearCalls, watchCalls atomic.Int64
}

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{addr: lis.Addr().String(), srv: grpc.NewServer()}
	api.RegisterTrackerServer(f.srv, f)
	go func() { _ = f.srv.Serve(lis) }()
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeNode) setTrack(h func(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error)) {
	f.mu.Lock()
	f.onTrack = h
	f.mu.Unlock()
}

func (f *fakeNode) setNear(h func(req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error)) {
	f.mu.Lock()
	f.onNear = h
	f.mu.Unlock()
}

func (f *fakeNode) setCluster(c *fakeCluster) {
	f.mu.Lock()
	f.cluster = c
	f.mu.Unlock()
}

func (f *fakeNode) TrackSeries(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
	f.trackCalls.Add(1)
	f.mu.Lock()
	h := f.onTrack
	f.mu.Unlock()
	if h == nil {
		return &api.TrackSeriesResponse{}, nil
	}
	return h(ctx, req)
}

func (f *fakeNode) GetUsersCloseToLimit(_ context.Context, req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
	f.nearCalls.Add(1)
	f.mu.Lock()
	h := f.onNear
	f.mu.Unlock()
	if h == nil {
		return nil, status.Error(codes.Unimplemented, "scripted: no near-limit answer")
	}
	return h(req)
}

func (f *fakeNode) WatchCluster(_ *api.WatchClusterRequest, stream grpc.ServerStreamingServer[api.ClusterView]) error {
	f.watchCalls.Add(1)
	f.mu.Lock()
	c := f.cluster
	f.mu.Unlock()
	if c == nil {
		return status.Error(codes.Unimplemented, "method WatchCluster not implemented")
	}
	var sent uint64
	_, _, broken := c.get() // breakStreams ends the streams open now
	for {
		v, changed, _ := c.get()
		if v != nil && v.Version != sent {
			if err := stream.Send(v); err != nil {
				return err
			}
			sent = v.Version
		}
		select {
		case <-changed:
		case <-broken:
			return status.Error(codes.Unavailable, "scripted: stream broken")
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// fakeCluster is the view the fake nodes serve on WatchCluster.
type fakeCluster struct {
	mu      sync.Mutex
	view    *api.ClusterView
	changed chan struct{}
	broken  chan struct{}
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{changed: make(chan struct{}), broken: make(chan struct{})}
}

func (c *fakeCluster) get() (*api.ClusterView, <-chan struct{}, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view, c.changed, c.broken
}

func (c *fakeCluster) set(v *api.ClusterView) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.view != nil {
		v.Version = c.view.Version
	}
	v.Version++
	c.view = v
	close(c.changed)
	c.changed = make(chan struct{})
}

// breakStreams ends every open stream with Unavailable.
func (c *fakeCluster) breakStreams() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.broken)
	c.broken = make(chan struct{})
}

// view builds a ClusterView: members are the nodes (alive, id = "n<i>"),
// leaders[g] is the index of group g's leader in nodes (-1 = none), every
// node is a voter of every group.
func view(p, g int, nodes []*fakeNode, leaders []int) *api.ClusterView {
	v := &api.ClusterView{Partitions: uint32(p), Groups: uint32(g), ServedBy: "fake"}
	var voters []string
	for i, n := range nodes {
		id := nodeID(i)
		voters = append(voters, id)
		m := &api.Member{Id: id, Zone: "z", GrpcAddress: n.addr, Status: "alive"}
		for grp, l := range leaders {
			if l == i {
				m.GroupsLed = append(m.GroupsLed, uint32(grp))
			}
		}
		v.Members = append(v.Members, m)
	}
	for grp := range g {
		gi := &api.GroupInfo{Group: uint32(grp), Voters: voters}
		if l := leaders[grp]; l >= 0 {
			gi.LeaderId = nodeID(l)
			gi.LeaderGrpcAddress = nodes[l].addr
		}
		v.GroupInfo = append(v.GroupInfo, gi)
	}
	return v
}

func nodeID(i int) string { return "n" + string(rune('0'+i)) }

func notLeaderErr(group int, addr string) error {
	st, err := status.New(codes.FailedPrecondition, "scripted: not leader").
		WithDetails(&api.NotLeader{Group: uint32(group), LeaderGrpcAddress: addr, LeaderId: "x"})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// rejectAll answers every hash as rejected.
func rejectAll(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
	return &api.TrackSeriesResponse{RejectedHashes: req.Hashes}, nil
}

// nearList answers GetUsersCloseToLimit with tenants for every group of a p/g layout.
func nearList(p, g int, tenants ...string) func(*api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
	return func(req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
		return &api.GetUsersCloseToLimitResponse{Tenants: tenants, Group: uint32(api.GroupOf(int(req.Partition), p, g))}, nil
	}
}

// hashesIn returns n distinct hashes of partition part among p.
func hashesIn(part, p, n int) []uint64 {
	first, _ := api.PartitionHashRange(part, p)
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)*7919
	}
	return out
}

// waitFor polls cond until it holds; the bound only turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// testConfig is a fast-retrying ModeSync configuration for addrs.
func testConfig(addrs ...string) Config {
	return Config{
		Addrs:        addrs,
		Mode:         ModeSync,
		RetryInitial: time.Millisecond,
		RetryMax:     10 * time.Millisecond,
	}
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
