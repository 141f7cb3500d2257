package layouttable

import (
	"context"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	"github.com/tollgate-io/tollgate/nodeport"
)

// fsmPort is a node with one replica of group 0: Propose applies the entry
// to a real FSM as raft would after the commit. It stands in for the raft
// log only (the server tests and integration/TestLayoutMoveWhileTracking
// run the real one); the rest of nodeport.Port is not used here.
type fsmPort struct {
	nodeport.Port
	f   *fsm.FSM
	idx uint64
}

func (p *fsmPort) Groups() int { return 4 }

func (p *fsmPort) Propose(_ context.Context, g int, typ byte, payload []byte) (any, error) {
	data, err := fsm.AppendModuleEntry(nil, typ, 1, payload)
	if err != nil {
		return nil, err
	}
	p.idx++
	res := p.f.Apply(&raft.Log{Index: p.idx, Term: 1, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); ok {
		return nil, err
	}
	return res, nil
}

func newService(t testing.TB) *Service {
	t.Helper()
	mod := fsmlayout.New(64, 4, nil)
	f, err := fsm.New(fsm.Config{Partitions: 64, Groups: 4, Shards: 4, Group: 0, Modules: []fsm.Module{mod}})
	if err != nil {
		t.Fatal(err)
	}
	return New(mod, &fsmPort{f: f}, 64, func(g int) (string, string) { return "n2", "10.0.0.2:7000" })
}

func TestRouteAndPropose(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	one := uint32(1)
	if g, err := s.Route(31, &one); err != nil || g != 1 || s.Owner(31) != 1 {
		t.Fatalf("arithmetic: route %d %v", g, err)
	}
	if g, err := s.Route(31, nil); err != nil || g != 1 {
		t.Fatalf("unrouted: %d %v", g, err)
	}
	if s.View() != nil {
		t.Fatal("the arithmetic travels in the view: want no layout field")
	}
	moved := api.ArithmeticTable(64, 4).Move(31, 2)
	if e, err := s.Propose(ctx, moved); err != nil || e != 1 {
		t.Fatalf("propose: %d %v", e, err)
	}
	// Routed by the old table: Moved, naming the owner and its leader.
	_, err := s.Route(31, &one)
	st, _ := status.FromError(err)
	var mv *api.Moved
	for _, d := range st.Details() {
		mv, _ = d.(*api.Moved)
	}
	if st.Code() != codes.Unavailable || mv == nil || mv.Group != 2 || mv.LayoutEpoch != 1 || mv.Partition != 31 || mv.LeaderGrpcAddress != "10.0.0.2:7000" {
		t.Fatalf("route by the old table: %v (detail %v)", err, mv)
	}
	two := uint32(2)
	if g, err := s.Route(31, &two); err != nil || g != 2 {
		t.Fatalf("route by the new table: %d %v", g, err)
	}
	if g, err := s.Route(31, nil); err != nil || g != 2 {
		t.Fatalf("unrouted after the move: %d %v", g, err)
	}
	v := s.View()
	if v == nil || v.Epoch != 1 || s.View() != v {
		t.Fatalf("view %v: want epoch 1, built once", v)
	}
	// The same epoch again: compare-and-set refuses it.
	if _, err := s.Propose(ctx, moved); status.Code(err) != codes.Aborted {
		t.Fatalf("stale proposal: %v, want Aborted", err)
	}
	for name, bad := range map[string]*api.Table{
		"epoch 0":      api.ArithmeticTable(64, 4),
		"other P":      api.ArithmeticTable(32, 4).Move(0, 1),
		"too many grp": moved.Move(0, 7),
	} {
		if _, err := s.Propose(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestRaise(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	port := s.port.(*fsmPort)
	var placed [][2]int
	place := func(from, to int) [][]raft.Server {
		placed = append(placed, [2]int{from, to})
		var out [][]raft.Server
		for range to - from {
			out = append(out, []raft.Server{{ID: "n1", Address: "127.0.0.1:1"}})
		}
		return out
	}
	from, res, err := s.Raise(ctx, 6, place)
	if err != nil || from != 4 || !res.Changed || res.Groups != 6 || res.Epoch != 1 || s.mod.Current().Groups != 6 {
		t.Fatalf("raise 4 → 6: from %d, %+v, %v", from, res, err)
	}
	// At the current count nothing is placed or proposed.
	idx := port.idx
	if from, res, err := s.Raise(ctx, 6, place); err != nil || from != 6 || res.Changed || port.idx != idx || len(placed) != 1 {
		t.Fatalf("raise 6 → 6: from %d, %+v, %v, %d entries proposed", from, res, err, port.idx-idx)
	}
	if _, _, err := s.Raise(ctx, 5, place); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("raise 6 → 5: %v, want InvalidArgument", err)
	}
	if _, _, err := s.Raise(ctx, 65, place); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("raise to 65 of 64 partitions: %v, want InvalidArgument", err)
	}
	// No voters placed: nothing is proposed, and retrying will not help.
	if _, _, err := s.Raise(ctx, 8, func(int, int) [][]raft.Server { return nil }); status.Code(err) != codes.FailedPrecondition || port.idx != idx {
		t.Fatalf("raise without voters: %v (%d entries proposed)", err, port.idx-idx)
	}
}

// TestLearn: a table learned from group 0's leader is routed by while it is
// newer than the node's replica, and only then; an older or invalid one is
// not recorded; once the replica catches up, the replica's table wins.
func TestLearn(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	raised, _, err := s.Current().Raise(8)
	if err != nil {
		t.Fatal(err)
	}
	moved := raised.Move(31, 6) // epoch 2: partition 31 in group 6
	if !s.Learn(moved) || s.Current() != moved || s.Owner(31) != 6 || s.View().GetEpoch() != 2 {
		t.Fatalf("learned epoch 2: current epoch %d, owner of 31 %d", s.Current().Epoch, s.Owner(31))
	}
	if s.Learn(raised) || s.Current() != moved {
		t.Fatal("an older table was learned over a newer one")
	}
	bad := moved.Move(31, 6)
	bad.Owner = bad.Owner[:10] // 10 partitions, not 64
	if s.Learn(bad) || s.Learn(nil) || s.Current() != moved {
		t.Fatal("an invalid table was learned")
	}
	if g, err := s.Route(31, nil); err != nil || g != 6 {
		t.Fatalf("route by the learned table: %d %v", g, err)
	}
	// The replica catches up (this node joined group 0): from the learned
	// table's epoch on, its own table is in force again.
	if _, err := s.Propose(ctx, s.Module().Current().Move(31, 2)); err != nil {
		t.Fatal(err)
	}
	if s.Current() != moved {
		t.Fatal("replica at epoch 1, learned 2: want the learned table")
	}
	if _, err := s.Propose(ctx, s.Module().Current().Move(31, 3)); err != nil {
		t.Fatal(err)
	}
	if s.Current() != s.Module().Current() || s.Owner(31) != 3 {
		t.Fatalf("replica at epoch 2 as learned: current epoch %d, owner of 31 %d; want the replica's", s.Current().Epoch, s.Owner(31))
	}
}
