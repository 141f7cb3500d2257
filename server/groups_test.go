package server

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/tollgate-io/tollgate/raftnode"
)

// countFSM counts the commands applied: the state machine of a raft group
// that serves no partition (the application's FSM for such a group is the
// next step of issue 38).
type countFSM struct{ n atomic.Int64 }

func (f *countFSM) Apply(*raft.Log) interface{}         { return f.n.Add(1) }
func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return countSnap{}, nil }
func (f *countFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type countSnap struct{}

func (countSnap) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (countSnap) Release()                             {}

// TestAddRaftGroup: a dev node (G = 4) creates raft group 4 on request; the
// group elects this node and applies, its leadership is left alone (no
// per-group state exists for it), the node keeps serving its partitions, and
// a restart over the data dir that now lists 5 groups is refused by name
// instead of failing on a group without a state machine.
func TestAddRaftGroup(t *testing.T) {
	dir := t.TempDir()
	s, c := startServer(t, dir, nil)
	defer s.Stop(context.Background())
	ctx := context.Background()
	f := &countFSM{}
	if err := s.addRaftGroup(ctx, 4, f); err != nil {
		t.Fatal(err)
	}
	if err := s.addRaftGroup(ctx, 4, &countFSM{}); !errors.Is(err, raftnode.ErrGroupExists) {
		t.Fatalf("adding group 4 twice: %v, want ErrGroupExists", err)
	}
	if err := s.addRaftGroup(ctx, 9, &countFSM{}); !errors.Is(err, raftnode.ErrGroupOutOfRange) {
		t.Fatalf("adding group 9 after 4: %v, want ErrGroupOutOfRange", err)
	}
	r := s.host.Raft(4)
	waitFor(t, "group 4 to elect this node", func() bool { return r.State() == raft.Leader })
	for range 3 {
		if err := r.Apply([]byte("x"), 10*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.n.Load(); got != 3 {
		t.Fatalf("group 4 applied %d commands, want 3", got)
	}
	// The boot groups still serve (their leadership events went through,
	// group 4's were skipped without touching any per-group state).
	if rej := track(t, c, "t1", 0, hashesIn(1, 0, 5)); len(rej) != 0 {
		t.Fatalf("track after adding a group: %d rejected", len(rej))
	}
	stop(t, s)

	_, err := New(s.cfg)
	if err == nil || !strings.Contains(err.Error(), "holds 5 raft groups") || !strings.Contains(err.Error(), "groups=4") {
		t.Fatalf("restart over a data dir listing 5 raft groups with groups=4: %v, want the refusal naming both", err)
	}
}
