package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode"
)

// growNode records what Growth asks of the node. The raft side (AddGroup,
// BootstrapGroup on a real host) is covered by the server's and the
// integration tests; this checks the order and the choices.
type growNode struct {
	groups, want int
	added        []int
	boots        []int
	failAdd      int // group whose Add fails once (-1: none)
}

func (n *growNode) config(self string) GrowthConfig {
	return GrowthConfig{NodeID: self, Log: slog.New(slog.DiscardHandler),
		Groups: func() int { return n.groups },
		Want:   func() int { return n.want },
		Add: func(_ context.Context, g int, _ raft.FSM) error {
			if g == n.failAdd {
				n.failAdd = -1
				return fmt.Errorf("disk full")
			}
			if g < n.groups {
				return raftnode.ErrGroupExists
			}
			n.added = append(n.added, g)
			n.groups++
			return nil
		},
		Bootstrap: func(g int, _ []raft.Server) error { n.boots = append(n.boots, g); return nil },
		NewFSM:    func(int, int) (raft.FSM, error) { return nopFSM{}, nil },
	}
}

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, nil }
func (nopFSM) Restore(io.ReadCloser) error         { return nil }

func TestGrowthCreatesInOrderAndBootstrapsItsGroups(t *testing.T) {
	n := &growNode{groups: 4, want: 8, failAdd: 6}
	gr := NewGrowth(n.config("a"))
	me := []raft.Server{{ID: "a", Address: "a:1"}, {ID: "b", Address: "b:1"}}
	other := []raft.Server{{ID: "b", Address: "b:1"}, {ID: "c", Address: "c:1"}}
	gr.Raised(4, [][]raft.Server{me, other, me, me})

	// Group 6 fails once: 4 and 5 exist, the voters of 4 are bootstrapped,
	// 6 and 7 wait for the retry.
	if err := gr.step(context.Background()); err == nil {
		t.Fatal("a failed Add must be reported for a retry")
	}
	if !slices.Equal(n.added, []int{4, 5}) {
		t.Fatalf("added %v after the failure, want [4 5]", n.added)
	}
	if err := gr.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.added, []int{4, 5, 6, 7}) {
		t.Fatalf("added %v, want [4 5 6 7] in order", n.added)
	}
	slices.Sort(n.boots)
	if !slices.Equal(n.boots, []int{4, 6, 7}) {
		t.Fatalf("bootstrapped %v, want the groups this node is a voter of: [4 6 7]", n.boots)
	}
	// Nothing left: a further step creates and bootstraps nothing.
	if err := gr.step(context.Background()); err != nil || len(n.added) != 4 || len(n.boots) != 3 {
		t.Fatalf("idle step: %v, added %v, boots %v", err, n.added, n.boots)
	}
	// A node that learns the raised table without the entry (a snapshot)
	// creates the groups and bootstraps none: their voters do.
	m := &growNode{groups: 4, want: 6, failAdd: -1}
	if err := NewGrowth(m.config("c")).step(context.Background()); err != nil || !slices.Equal(m.added, []int{4, 5}) || len(m.boots) != 0 {
		t.Fatalf("from a snapshot: %v, added %v, boots %v", err, m.added, m.boots)
	}
}
