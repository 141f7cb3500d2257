package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/layout"
)

// TestRaiseMovesMetering: a raise's partition moves carry the metering of
// their targets along, under a stream of events sent round robin to three
// nodes. Every event sent during the raise is answered without an error
// (the nodes re-route those a move answers Moved); afterwards each target
// has exactly its one open span, in the group the table gives its partition
// (for moved partitions: a raised group), and a retry of a start accepted
// before the raise is still a duplicate.
//
// "series only" raises with gives that move series only, as a version-7
// build's did: the metering stays in its first groups, and the events still
// reach it (the owner answers Moved, the node tries the home group).
func TestRaiseMovesMetering(t *testing.T) {
	t.Run("with metering", func(t *testing.T) { testRaiseMetering(t, false) })
	t.Run("series only", func(t *testing.T) { testRaiseMetering(t, true) })
}

func testRaiseMetering(t *testing.T, seriesOnly bool) {
	tc := startCluster(t, 3, nil)
	nodes := tc.live()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodes[0].cfg.Layout.Partitions
	target := layout.RaiseTarget(p, 4, 8)
	for _, s := range nodes {
		waitFor(t, s.cfg.Node.ID+" routes metering by the layout table", s.meterByLayout)
		s.meterRoute.seriesOnly.Store(seriesOnly)
	}

	const nTargets = 48
	targets := make([]fsmmeter.Target, nTargets)
	moving := 0
	for i := range targets {
		targets[i] = fsmmeter.Target{Org: "org", Space: "space", Consumer: fmt.Sprintf("c%d", i), Resource: "db", Plan: "small", Instance: "i"}
		if target[api.Partition(fsmmeter.TargetHash(targets[i]), p)] >= 4 {
			moving++
		}
	}
	if moving < nTargets/4 {
		t.Fatalf("only %d of %d targets in partitions the raise moves", moving, nTargets)
	}
	now := time.Now().UnixMilli()
	first := make([]fsmmeter.Event, nTargets)
	for i, tg := range targets {
		first[i] = fsmmeter.Event{Kind: fsmmeter.Start, ID: fmt.Sprintf("start-%d-0", i), Target: tg, Timestamp: now, Measures: []fsmmeter.Measure{{Name: "mem", Quantity: 1}}}
		if _, err := nodes[i%3].meter.Submit(ctx, first[i]); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}

	// Each target is stopped and started again, over and over, while the
	// raise moves partitions: a stop that went to a group without the span,
	// or a start to a group without the open one, would be refused.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 1; ; round++ {
				for i := w; i < nTargets; i += 3 {
					select {
					case <-stop:
						return
					default:
					}
					ts := time.Now().UnixMilli()
					for _, ev := range []fsmmeter.Event{
						{Kind: fsmmeter.Stop, ID: fmt.Sprintf("stop-%d-%d", i, round), Target: targets[i], Timestamp: ts},
						{Kind: fsmmeter.Start, ID: fmt.Sprintf("start-%d-%d", i, round), Target: targets[i], Timestamp: ts, Measures: []fsmmeter.Measure{{Name: "mem", Quantity: 1}}},
					} {
						sent.Add(1)
						r, err := nodes[(i+round)%3].meter.Submit(ctx, ev)
						if err == nil && r.Duplicate {
							err = fmt.Errorf("a fresh id answered duplicate")
						}
						if err != nil {
							failed.Add(1)
							firstErr.CompareAndSwap(nil, fmt.Sprintf("%s of target %d: %v", ev.ID, i, err))
						}
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := nodes[0].RaiseGroups(ctx, 8); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every partition at the raise's target", func() bool {
		tab := nodes[0].layout.Current()
		for q := range p {
			if tab.GroupOf(q) != target[q] {
				return false
			}
		}
		return true
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d events failed during the raise; the first: %v", n, sent.Load(), firstErr.Load())
	}
	if sent.Load() < nTargets {
		t.Fatalf("only %d events sent during the raise", sent.Load())
	}

	// Each target's open span is in one group: its partition's owner, or
	// its home group after series-only moves.
	for i, tg := range targets {
		want := target[api.Partition(fsmmeter.TargetHash(tg), p)]
		if seriesOnly {
			want = layout.GroupOf(api.Partition(fsmmeter.TargetHash(tg), p), p, 4)
		}
		var where []int
		for g := range 8 {
			for _, sp := range tc.leader(g).meterMods[g].Spans() {
				if sp.Target == tg && !sp.Stopped {
					where = append(where, g)
				}
			}
		}
		if len(where) != 1 || where[0] != want {
			t.Fatalf("target %d (partition's group %d): open spans in groups %v", i, want, where)
		}
		if !tc.leader(want).meterMods[want].Owns(api.Partition(fsmmeter.TargetHash(tg), p)) {
			t.Fatalf("group %d does not hold target %d's partition", want, i)
		}
	}
	for i := range targets {
		r, err := nodes[(i+1)%3].meter.Submit(ctx, first[i])
		if err != nil || !r.Duplicate {
			t.Fatalf("retry of target %d's first start after the raise: %+v, %v", i, r, err)
		}
	}
	t.Logf("%d events during the raise, %d targets in moved partitions", sent.Load(), moving)
}
