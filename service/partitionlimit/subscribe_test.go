package partitionlimit

import (
	"context"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// serve runs h's gRPC service on loopback and returns a client.
func serve(t *testing.T, h *Hub) api.SketchesClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	api.RegisterSketchesServer(gs, NewService(h, make(chan struct{})))
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return api.NewSketchesClient(cc)
}

// TestWatchFollowsSubscribedTenants: a stream that names its tenants carries
// only theirs, in its first (full) batch and in the changes after; one that
// names none (an older client) carries every tenant's; bad subscriptions are
// refused naming the field.
func TestWatchFollowsSubscribedTenants(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, nil)
	c := serve(t, h)
	p := uint8(h.Precision())
	r := rand.New(rand.NewPCG(1, 2))
	minute := clk.now().Unix() / 60
	push := func(tenants ...string) {
		t.Helper()
		var sks []*api.Sketch
		for i, tn := range tenants {
			sks = append(sks, sketchOf(r, tn, uint32(i), minute, 50, p, false))
		}
		if _, err := c.PushSketches(context.Background(), &api.PushSketchesRequest{Precision: uint32(p), Sketches: sks}); err != nil {
			t.Fatal(err)
		}
	}
	push("a", "b", "c")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenantsOf := func(st grpc.ServerStreamingClient[api.SketchBatch]) map[string]bool {
		t.Helper()
		b, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, sk := range b.Sketches {
			out[sk.Tenant] = true
		}
		return out
	}
	sub, err := c.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: uint32(p), OnlyTenants: true, Tenants: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: uint32(p)})
	if err != nil {
		t.Fatal(err)
	}
	if got := tenantsOf(sub); len(got) != 1 || !got["b"] {
		t.Fatalf("subscribed stream's first batch: tenants %v, want only b", got)
	}
	if got := tenantsOf(all); len(got) != 3 {
		t.Fatalf("unsubscribed stream's first batch: tenants %v, want a, b and c", got)
	}
	// Changes: a and c move first; the subscribed stream must stay silent
	// about them and carry b's change.
	push("a", "c", "b")
	if got := tenantsOf(sub); len(got) != 1 || !got["b"] {
		t.Fatalf("subscribed stream's change batch: tenants %v, want only b", got)
	}
	none, err := c.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: uint32(p), OnlyTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := tenantsOf(none); len(got) != 0 {
		t.Fatalf("a stream subscribed to no tenant carried %v", got)
	}
	for name, req := range map[string]*api.WatchSketchesRequest{
		"tenants without only_tenants": {Precision: uint32(p), Tenants: []string{"a"}},
		"invalid tenant id":            {Precision: uint32(p), OnlyTenants: true, Tenants: []string{"a", ""}},
		"too many tenants":             {Precision: uint32(p), OnlyTenants: true, Tenants: make([]string, MaxSubscribedTenants+1)},
	} {
		st, err := c.WatchSketches(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tenants") {
			t.Errorf("%s: %v, want InvalidArgument naming tenants", name, err)
		}
	}
}
