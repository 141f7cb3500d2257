package clientlib

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

func movedErr(part, group int, epoch uint64, leader string) error {
	st, err := status.New(codes.Unavailable, "scripted: moved").
		WithDetails(&api.Moved{Partition: uint32(part), Group: uint32(group), LayoutEpoch: epoch, LeaderGrpcAddress: leader})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// A Moved answer sends the request to the owner it names, at once and
// without an error; a Moved answer from a replica whose table is older than
// the client's is waited out at the client's owner, not followed back. The
// nodes are scripted (fakeNode): a real cluster produces a stale replica's
// answer only by chance (integration.TestLayoutMoveWhileTracking runs the
// real one).
func TestMovedFollowed(t *testing.T) {
	a, b := newFakeNode(t), newFakeNode(t) // leaders of groups 0 and 1
	const p, g, part = 8, 2, 1             // partition 1 is group 0's by the arithmetic
	cl := newFakeCluster()
	cl.set(view(p, g, []*fakeNode{a, b}, []int{0, 1}))
	a.setCluster(cl)
	var routedToA, routedToB atomic.Int64 // the group each request named
	a.setTrack(func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		routedToA.Store(int64(req.GetGroup()))
		return nil, movedErr(part, 1, 1, b.addr)
	})
	var staleOnce atomic.Bool
	b.setTrack(func(_ context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
		routedToB.Store(int64(req.GetGroup()))
		if staleOnce.CompareAndSwap(true, false) {
			return nil, movedErr(part, 0, 1, a.addr) // a replica that has not applied epoch 2
		}
		return rejectAll(context.Background(), req)
	})
	c := newTestClient(t, testConfig(a.addr))
	waitFor(t, "the first view", func() bool { return c.Stats().WatchViews > 0 })

	hs := hashesIn(part, p, 2)
	rej, err := c.TrackSeries(context.Background(), "t", hs)
	if err != nil || len(rej) != 2 {
		t.Fatalf("after Moved: rejected %x, err %v; want b's answer", rej, err)
	}
	if routedToA.Load() != 0 || routedToB.Load() != 1 || c.Stats().Moved != 1 {
		t.Fatalf("routed to a as group %d, to b as group %d, %d Moved; want 0, 1, 1", routedToA.Load(), routedToB.Load(), c.Stats().Moved)
	}

	// The view now carries epoch 2 (partition 1 → group 1): the client
	// routes there itself, and b's one stale Moved (epoch 1, group 0) does
	// not send it back to a.
	v := view(p, g, []*fakeNode{a, b}, []int{0, 1})
	v.Layout = api.LayoutToProto(api.ArithmeticTable(p, g).Move(part, 1).Move(part, 1))
	if v.Layout.Epoch != 2 {
		t.Fatalf("test table epoch %d", v.Layout.Epoch)
	}
	cl.set(v)
	waitFor(t, "the epoch-2 table", func() bool { return c.table.Load().Epoch == 2 })
	staleOnce.Store(true)
	aCalls := a.trackCalls.Load()
	if rej, err := c.TrackSeries(context.Background(), "t", hs); err != nil || len(rej) != 2 {
		t.Fatalf("with a stale Moved: rejected %x, err %v", rej, err)
	}
	if a.trackCalls.Load() != aCalls || staleOnce.Load() {
		t.Fatalf("a got %d calls, stale answer given: %v; want none and given", a.trackCalls.Load()-aCalls, !staleOnce.Load())
	}
	if st := c.Stats(); st.Moved != 2 || st.Errors != 0 {
		t.Fatalf("stats %+v: want 2 Moved, no errors", st)
	}
	// A view from a node without the table (epoch 0) does not take it back.
	cl.set(view(p, g, []*fakeNode{a, b}, []int{0, 1}))
	waitFor(t, "the next view", func() bool { return c.Stats().WatchViews >= 3 })
	if c.table.Load().Epoch != 2 {
		t.Fatal("an older view replaced the table")
	}
}
