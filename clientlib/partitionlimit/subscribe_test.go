package partitionlimit

import (
	"context"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
)

// TestWatchFollowsCheckedTenants: two clients on one real hub (gRPC on
// loopback). A checks t1 and t2; B checks only t1, so its stream carries
// t1's sketches and never t2's; once B checks t2 it subscribes again and
// receives t2's sketches from the hub.
func TestWatchFollowsCheckedTenants(t *testing.T) {
	hub, err := partitionlimit.New(partitionlimit.Config{NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	api.RegisterSketchesServer(gs, partitionlimit.NewService(hub, make(chan struct{})))
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	limits := limitsOf(map[string]int64{"t1": 1 << 40, "t2": 1 << 40})
	newClient := func() *Limiter {
		l, err := New(Config{Limits: limits, Addrs: []string{lis.Addr().String()}, PushInterval: 20 * time.Millisecond,
			ResubscribeEvery: 50 * time.Millisecond, Precision: hub.Precision(), WindowMinutes: hub.WindowMinutes()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := newClient(), newClient()
	r := rand.New(rand.NewPCG(3, 3))
	for _, tn := range []string{"t1", "t2"} {
		if err := a.Check(tn, []Series{{Partition: 7, Hashes: hashes(r, 2000)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Check("t1", []Series{{Partition: 1, Hashes: hashes(r, 10)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if ctx.Err() != nil {
				t.Fatalf("%s: not within a minute", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil("B to receive t1's sketch from A", func() bool { return b.Estimate("t1", 7) > 1500 })
	if est := b.Estimate("t2", 7); est != 0 {
		t.Fatalf("B, which never checked t2, holds an estimate of %.0f for it: its stream carried t2", est)
	}
	if err := b.Check("t2", []Series{{Partition: 1, Hashes: hashes(r, 10)}}); err != nil {
		t.Fatal(err)
	}
	waitUntil("B to receive t2's sketch once it checked t2", func() bool { return b.Estimate("t2", 7) > 1500 })
}
