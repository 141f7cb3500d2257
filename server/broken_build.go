//go:build tollgate_broken

package server

// This file compiles only with the tollgate_broken build tag, which no
// production build uses (see testBreak). It exists so that the fault tests
// can run a real cluster of deliberately broken servers and show that the
// linearizability check of their recorded history fails: a checker that
// passes a broken build proves nothing. $TOLLGATE_BROKEN picks the bug.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
)

func init() {
	switch mode := os.Getenv("TOLLGATE_BROKEN"); mode {
	case "":
	case "ack-before-commit":
		testBreak = ackBeforeCommit
	case "lost-write":
		testBreak = lostWrite
	case "forget-accepted":
		testBreak = forgetAccepted
	default:
		fmt.Fprintf(os.Stderr, "TOLLGATE_BROKEN=%q: unknown mode (ack-before-commit, lost-write, forget-accepted)\n", mode)
		os.Exit(2)
	}
}

// ackBeforeCommit: the leader answers "all accepted" at once and proposes
// afterwards, so an answer does not wait for (or agree with) the decision
// that commits: new series are acknowledged past the limit.
func ackBeforeCommit(ctx context.Context, g *groupTracker, tenant string, hashes []uint64) ([]uint64, error) {
	if !g.ready() {
		return g.trackCommitted(ctx, tenant, hashes)
	}
	go func() { _, _ = g.trackCommitted(context.Background(), tenant, hashes) }()
	return nil, nil
}

var lostWrites atomic.Int64

// lostWrite: every fourth request the leader acknowledges is never proposed
// (a write lost between the answer and the log); the others commit, so the
// tenant still fills up and a re-send of a lost series can be refused.
func lostWrite(ctx context.Context, g *groupTracker, tenant string, hashes []uint64) ([]uint64, error) {
	if g.ready() && lostWrites.Add(1)%4 == 0 {
		return nil, nil
	}
	return g.trackCommitted(ctx, tenant, hashes)
}

var forgotten struct {
	sync.Mutex
	accepted map[string]map[uint64]bool // per tenant: hashes this node acknowledged
}

// forgetAccepted: when a tenant is at its limit (the answer refuses some
// new series), the node also refuses one series it acknowledged before, as
// a leader that lost part of its state would.
func forgetAccepted(ctx context.Context, g *groupTracker, tenant string, hashes []uint64) ([]uint64, error) {
	rej, err := g.trackCommitted(ctx, tenant, hashes)
	if err != nil {
		return rej, err
	}
	forgotten.Lock()
	defer forgotten.Unlock()
	if forgotten.accepted == nil {
		forgotten.accepted = map[string]map[uint64]bool{}
	}
	seen := forgotten.accepted[tenant]
	if seen == nil {
		seen = map[uint64]bool{}
		forgotten.accepted[tenant] = seen
	}
	if len(rej) > 0 {
		for _, h := range hashes {
			if seen[h] && !slices.Contains(rej, h) {
				rej = append(rej, h)
				break
			}
		}
	}
	for _, h := range hashes {
		if !slices.Contains(rej, h) {
			seen[h] = true
		}
	}
	return rej, nil
}
