package cluster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode"
)

// GrowthConfig is what Growth needs of the node.
type GrowthConfig struct {
	NodeID string
	// Groups is the number of raft groups the node runs; Want the number
	// the layout table names (group 0's replica here).
	Groups, Want func() int
	// Add creates raft group g (the next one) with f as its state machine
	// (raftnode.Host.AddGroup through the node); Bootstrap bootstraps it
	// with the given voters (raftnode.Host.BootstrapGroup).
	Add       func(ctx context.Context, g int, f raft.FSM) error
	Bootstrap func(g int, servers []raft.Server) error
	// NewFSM is the empty state machine of group g of groups.
	NewFSM func(g, groups int) (raft.FSM, error)
	Log    *slog.Logger
}

// Growth is the node's part in raising the group count
// (docs/online-groups.md): every node creates the groups the layout table
// names and it does not run yet, in order and empty, and bootstraps those
// it is a voter of with the configuration the layout-raise entry carries;
// every voter uses the same one, so raft treats the bootstraps as one.
// Creating groups waits on raft's disk: it runs in Run, woken by Poke.
type Growth struct {
	cfg  GrowthConfig
	poke chan struct{}

	mu     sync.Mutex
	voters map[int][]raft.Server // new group → its voters, until bootstrapped here
}

// NewGrowth returns the node's growth loop; start it with Run.
func NewGrowth(cfg GrowthConfig) *Growth {
	return &Growth{cfg: cfg, poke: make(chan struct{}, 1), voters: map[int][]raft.Server{}}
}

// Poke wakes Run: the table may name more groups. Never blocks.
func (gr *Growth) Poke() {
	select {
	case gr.poke <- struct{}{}:
	default:
	}
}

// Raised records the voters of groups from, from+1, … (one list each) that
// a layout-raise entry names, and wakes Run. Quick: called on group 0's
// apply goroutine.
func (gr *Growth) Raised(from int, voters [][]raft.Server) {
	gr.mu.Lock()
	for i, vs := range voters {
		gr.voters[from+i] = slices.Clone(vs)
	}
	gr.mu.Unlock()
	gr.Poke()
}

// Run creates and bootstraps groups whenever woken, retrying a failure
// every second, until stop closes.
func (gr *Growth) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	gr.Poke() // the table may have been replayed before Run started
	failed := false
	for {
		select {
		case <-stop:
			return
		case <-gr.poke:
		case <-retry.C:
			if !failed {
				continue
			}
		}
		err := gr.step(ctx)
		if failed = err != nil; failed && ctx.Err() == nil {
			gr.cfg.Log.Warn("creating the groups of a raise; retrying", "err", err)
		}
	}
}

// step creates groups Groups()..Want()-1, then bootstraps the created
// groups this node is a voter of.
func (gr *Growth) step(ctx context.Context) error {
	want := gr.cfg.Want()
	for g := gr.cfg.Groups(); g < want; g++ {
		f, err := gr.cfg.NewFSM(g, want)
		if err != nil {
			return err
		}
		if err := gr.cfg.Add(ctx, g, f); err != nil && !errors.Is(err, raftnode.ErrGroupExists) {
			return err
		}
	}
	gr.mu.Lock()
	defer gr.mu.Unlock()
	have := gr.cfg.Groups()
	for g, servers := range gr.voters {
		if g >= have {
			continue
		}
		if slices.ContainsFunc(servers, func(v raft.Server) bool { return string(v.ID) == gr.cfg.NodeID }) {
			if err := gr.cfg.Bootstrap(g, servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
				return err
			}
			gr.cfg.Log.Info("bootstrapped a group added by a raise", "group", g, "voters", len(servers))
		}
		delete(gr.voters, g)
	}
	return nil
}
