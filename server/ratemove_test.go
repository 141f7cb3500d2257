package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/layout"
)

// TestRaiseMovesRateOwners: a raise's partition moves carry rate owners
// along. A 5-a-second Envoy key whose partition the raise 4 → 8 hands to a
// new group is owned, once the moves are done, by that group's leader (no
// longer by its old group's), and its requests are still decided exactly
// there: 5 back to back admitted, the 6th refused, over three nodes.
func TestRaiseMovesRateOwners(t *testing.T) {
	// Leadership stays where elections put it: a balancer's move of the
	// old group's leadership onto the new owner's node leaves no hand-off
	// to count (the node held the window itself; CI under -race once).
	tc := startCluster(t, 3, func(_ int, c *Config) { c.Cluster.LeaderBalanceInterval = -1 })
	nodes := tc.live()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, send := rlsRoundRobin(ctx, t, nodes, rlsWindowConfig)
	cfg, err := envoyrl.Parse([]byte(rlsWindowConfig))
	if err != nil {
		t.Fatal(err)
	}
	idx := envoyrl.NewIndex(map[string]*envoyrl.Config{"win": cfg})
	p := nodes[0].cfg.Layout.Partitions
	target := layout.RaiseTarget(p, 4, 8)
	// Two values of the "small" rule whose partitions move to new groups:
	// one used before the raise, one after it.
	var values []string
	var keys []string
	for i := 0; len(values) < 2; i++ {
		v := fmt.Sprintf("s-%d", i)
		entries := []envoyrl.Entry{{Key: "small", Value: v}}
		r, _ := idx.Match("win", entries)
		if r == nil {
			t.Fatal("no rule matches small")
		}
		k := envoyrl.CounterKey(r, entries)
		if part := api.RatePartition(k, p); target[part] >= 4 {
			values, keys = append(values, v), append(keys, k)
		}
	}
	call := func(v string) bool {
		t.Helper()
		return send(rlsReq("win", "small", v)).OverallCode == rlsv3.RateLimitResponse_OK
	}
	oldGroup := api.RateGroup(keys[0], p, 4)
	call(values[0])
	oldOwner := tc.leader(oldGroup)
	waitFor(t, "the key's old group's leader owns it", func() bool { return oldOwner.rates.Owned(keys[0]) })

	// Which nodes lead the old group from the raise on: a node that led it
	// takes the moved key with no hand-off due (it held the window itself).
	var ledMu sync.Mutex
	ledOld := map[*Server]bool{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for watchCtx.Err() == nil {
			for _, s := range nodes {
				if s.Raft(oldGroup).State() == raft.Leader {
					ledMu.Lock()
					ledOld[s] = true
					ledMu.Unlock()
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	if _, err := nodes[0].RaiseGroups(ctx, 8); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every node routes by the raise's target table", func() bool {
		for _, s := range nodes {
			tab := s.layout.Current()
			for q := range p {
				if tab.GroupOf(q) != target[q] {
					return false
				}
			}
		}
		return true
	})
	newGroup := target[api.RatePartition(keys[0], p)]
	for _, s := range nodes {
		waitFor(t, s.cfg.Node.ID+"'s rate owner to route by the new table", func() bool { return s.rates.GroupOf(keys[0]) == newGroup })
	}
	var newOwner *Server
	waitFor(t, fmt.Sprintf("group %d's leader to own the moved key", newGroup), func() bool {
		call(values[0]) // its clients report it to the new owner
		newOwner = tc.leader(newGroup)
		return newOwner.rates.Owned(keys[0])
	})
	if newOwner != oldOwner {
		waitFor(t, "the old owner to let the key go", func() bool { return !oldOwner.rates.Owned(keys[0]) })
		// The sliding key was handed over by its old owner (RateAdmit.Handoff,
		// node to node; service/ratelimit TestServiceHandoffOverGRPC checks
		// what it carries), or, on a machine too loaded for the old owner
		// to take the new table within the second the new one holds the
		// key, its wait ended and the key was rebuilt from the reports.
		// An election can still put the old group's leadership on the new
		// owner's node around the moves: then it takes the key with no
		// hand-off due (it led the group the key moved from).
		// And a node whose first table was already the moved one (it
		// learned none before the raise: a slow start under -race) saw no
		// move, so it takes the key as after a takeover, with no hand-off
		// to count. Neither case is what this test checks (the hand-off's
		// content is service/ratelimit's TestServiceHandoffOverGRPC), so a
		// count that stays 0 is logged, not failed: CI once waited 30 s
		// for one with the new owner never leading the old group.
		var led bool
		deadline := time.Now().Add(10 * time.Second)
		for {
			h, m := newOwner.rates.Handoffs()
			ledMu.Lock()
			led = ledOld[newOwner]
			ledMu.Unlock()
			if h+m >= 1 || led || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		h, m := newOwner.rates.Handoffs()
		t.Logf("hand-offs on the new owner: %d handed, %d missed (it led the old group since the raise: %v)", h, m, led)
	}
	for _, s := range nodes {
		if s != newOwner && s.rates.Owned(keys[0]) {
			t.Errorf("%s still owns the moved key beside group %d's leader %s", s.cfg.Node.ID, newGroup, newOwner.cfg.Node.ID)
		}
	}
	// A key first used after the move: decided by its new owner, exactly.
	// The rule is a one-second sliding window, so the sixth request must be
	// refused when all six were decided within one second: from the first
	// one's send to the last one's answer. (A CI machine under load once
	// took longer, and then the sixth rightly got a slot back.)
	var got []bool
	start := time.Now()
	for range 6 {
		got = append(got, call(values[1]))
	}
	span := time.Since(start)
	for i, g := range got {
		want := i < 5
		if i == 5 && span >= time.Second {
			continue // the first admission may have left the window
		}
		if g != want {
			t.Fatalf("5/s key in a moved partition, request %d of 6 within %v admitted %v (all %v)", i+1, span, g, got)
		}
	}
	// Ownership follows the leader at the owner's next round (a leadership
	// change under -race is not what this checks).
	g := target[api.RatePartition(keys[1], p)]
	waitFor(t, fmt.Sprintf("group %d's leader to own the key first used after the move", g), func() bool {
		return tc.leader(g).rates.Owned(keys[1])
	})
}
