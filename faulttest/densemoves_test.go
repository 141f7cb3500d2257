package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

// TestDenseMovesAcrossGroups: calls that span every group while leadership
// moves densely. Four writers track 256 series per call spread over all 64
// partitions (so every call needs all four groups' leaders), through
// clientlib in sync mode with a 5 s caller deadline, while one group's
// leadership is moved every 0.14 s on average (each group every 0.56 s,
// the four concurrently) for TOLLGATE_DENSE_MOVES moves (default 60).
// Every call must succeed: each partition retries on its own, follows the
// leader named in the answer and restarts its backoff when it learns a new
// leader. Every call is recorded and the history checked (no acknowledged
// series refused later, across the moves). Latency (p50, p99, max) and retries per call are logged with the
// load average, not asserted.
//
//	go test -count=1 -run TestDenseMovesAcrossGroups -v ./faulttest/
func TestDenseMovesAcrossGroups(t *testing.T) {
	moves := 60
	if v := os.Getenv("TOLLGATE_DENSE_MOVES"); v != "" {
		if _, err := fmt.Sscan(v, &moves); err != nil || moves < 1 {
			t.Fatalf("TOLLGATE_DENSE_MOVES=%q: want a positive integer", v)
		}
	}
	c := newCluster(t, clusterOptions{defaultMaxSeries: 0, extraArgs: []string{"--leader-balance-interval", "-1s"}})
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken, Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := cl.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	// No limit here, so the model checks that no acknowledged series is
	// refused later, across the moves.
	th := c.recordTracks(map[string]int{"dense-0": 0, "dense-1": 0, "dense-2": 0, "dense-3": 0})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lats []time.Duration
	var errs []string
	var calls atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			hashes := make([]uint64, 256)
			for !isClosed(stop) {
				for i := range hashes {
					hashes[i] = r.Uint64N(1<<20) * 0x9e3779b97f4a7c15 // spread over every partition, re-sent often
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := th.track(ctx, cl, w, fmt.Sprintf("dense-%d", w), hashes)
				cancel()
				calls.Add(1)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
				} else {
					lats = append(lats, time.Since(start))
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	st0 := cl.Stats()
	calls0 := calls.Load()

	var moved, refused atomic.Int64
	var mwg sync.WaitGroup
	began := time.Now()
	for g := range groups {
		mwg.Add(1)
		go func() {
			defer mwg.Done()
			time.Sleep(time.Duration(g) * 140 * time.Millisecond) // staggered: one move every 0.14 s overall
			for i := g; i < moves; i += groups {
				next := time.Now().Add(560 * time.Millisecond)
				l, _ := c.leaderOf(g)
				if l == nil {
					l = c.nodes[0]
				}
				ctx, cancel := adminCtx(context.Background(), 10*time.Second)
				_, err := c.admin(l).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g)})
				cancel()
				if err != nil {
					refused.Add(1)
				} else {
					moved.Add(1)
				}
				time.Sleep(time.Until(next))
			}
		}()
	}
	mwg.Wait()
	took := time.Since(began)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	st1 := cl.Stats()

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lats)
	q := func(f float64) time.Duration {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(f*float64(len(lats))))].Round(time.Millisecond)
	}
	n := calls.Load() - calls0
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%d moves asked in %v (%d done, %d refused or timed out); %d calls across every group during them: p50 %v, p99 %v, max %v; %.1f retries and %.1f NotLeader answers per call; load average %s",
		moves, took.Round(100*time.Millisecond), moved.Load(), refused.Load(), n, q(0.5), q(0.99), q(1),
		float64(st1.Retries-st0.Retries)/float64(max(n, 1)), float64(st1.NotLeaderRedirects-st0.NotLeaderRedirects)/float64(max(n, 1)), load)
	if moved.Load() == 0 {
		t.Error("no leadership move succeeded")
	}
	if len(errs) > 0 {
		t.Errorf("%d of %d calls failed under dense leadership moves; first: %q", len(errs), calls.Load(), errs[:min(3, len(errs))])
	}
	th.check()
	c.checkNoCrashes()
}
