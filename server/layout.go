package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/layouttable"
	"github.com/tollgate-io/tollgate/layout"
)

// The partition → group table (fsm/layouttable) lives in group 0's FSM; this
// node decides and routes by its replica of it (ownerOf), which is the
// arithmetic until a layout-set entry applies, and carries it to clients in
// the cluster view. A node that holds no replica of group 0 keeps the
// arithmetic: deciding by the table there waits for the hand-off work of
// docs/online-groups.md, which also moves a partition's state.

// ownerOf is the group owning partition p by this node's table.
func (s *Server) ownerOf(p int) int { return s.layout.Current().GroupOf(p) }

// routeTrack returns the group that decides partition p for a request
// routed to group routed (nil: the client did not say, before the table).
// A request routed to a group that does not own p is Unavailable with a
// Moved detail: refresh the layout and retry. (The table names only groups
// this node runs: fsm/layouttable refuses others.)
func (s *Server) routeTrack(p int, routed *uint32) (int, error) {
	t := s.layout.Current()
	g := t.GroupOf(p)
	if routed == nil || int(*routed) == g {
		return g, nil
	}
	id, addr := s.leaderOf(g)
	mv := &api.Moved{Partition: uint32(p), Group: uint32(g), LayoutEpoch: t.Epoch, LeaderId: id, LeaderGrpcAddress: addr}
	msg := fmt.Sprintf("partition %d moved: group %d does not own it, group %d does (layout epoch %d); refresh the layout and retry", p, *routed, g, t.Epoch)
	st, err := status.New(codes.Unavailable, msg).WithDetails(mv)
	if err != nil {
		return 0, status.Error(codes.Unavailable, msg)
	}
	return 0, st.Err()
}

// ProposeLayout replaces the layout table with t (whose epoch must be the
// current one plus one) through group 0's log; this node must lead group 0
// and every server of group 0 must support the table's cluster version. It
// returns the epoch in force afterwards. No admin command calls it yet (the
// coordinator of docs/online-groups.md will); tests do.
func (s *Server) ProposeLayout(ctx context.Context, t *layout.Table) (uint64, error) {
	if err := t.Validate(s.cfg.Partitions); err != nil {
		return 0, status.Error(codes.InvalidArgument, err.Error())
	}
	if t.Epoch == 0 {
		return 0, status.Error(codes.InvalidArgument, "layout epoch = 0: that is the arithmetic; a new table's epoch is the current one plus one")
	}
	if t.Groups > s.cfg.Groups {
		return 0, status.Errorf(codes.InvalidArgument, "layout groups = %d: this cluster runs %d groups", t.Groups, s.cfg.Groups)
	}
	res, err := nodePort{s}.Propose(ctx, 0, layouttable.EntrySet, layouttable.AppendSet(nil, layouttable.Set{Expected: t.Epoch - 1, Table: t}))
	if err != nil {
		return 0, err
	}
	r, _ := res.(layouttable.SetResult)
	if r.Refused != "" {
		return r.Epoch, status.Errorf(codes.Aborted, "layout: %s", r.Refused)
	}
	return r.Epoch, nil
}
