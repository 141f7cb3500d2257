package layouttable

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/nodeport"
)

// OrderGroup is the group whose log orders the table.
const OrderGroup = 0

// Service is one node's view of the layout table.
type Service struct {
	mod        *fsmlayout.Module
	port       nodeport.Port
	partitions int
	// leaderOf names group g's leader (id, gRPC address; "" if unknown).
	leaderOf func(g int) (string, string)

	// learned is the table group 0's leader last named (Follow), on a node
	// that holds no replica of group 0; nil until one newer than the
	// replica's arrives.
	learned atomic.Pointer[layout.Table]

	mu       sync.Mutex
	viewOf   *layout.Table // the table view was built from
	viewForm *api.PartitionLayout
}

// New returns the service over group 0's module of a cluster of p partitions.
func New(mod *fsmlayout.Module, port nodeport.Port, p int, leaderOf func(g int) (string, string)) *Service {
	return &Service{mod: mod, port: port, partitions: p, leaderOf: leaderOf}
}

// Module is the FSM module group 0 carries.
func (s *Service) Module() *fsmlayout.Module { return s.mod }

// Current is the table this node routes by: its replica of group 0's, or
// the one it learned from group 0's leader (Follow) when that one is newer.
// Safe from any goroutine; the table must not be modified.
func (s *Service) Current() *layout.Table {
	t := s.mod.Current()
	if l := s.learned.Load(); l != nil && l.Epoch > t.Epoch {
		return l
	}
	return t
}

// Learn records t, a table group 0's leader named, and reports whether it is
// newer than what this node routes by (so it is now Current). An invalid
// table is not recorded.
func (s *Service) Learn(t *layout.Table) bool {
	if t == nil || t.Validate(s.partitions) != nil {
		return false
	}
	for {
		old := s.learned.Load()
		if (old != nil && old.Epoch >= t.Epoch) || s.mod.Current().Epoch >= t.Epoch {
			return false
		}
		if s.learned.CompareAndSwap(old, t) {
			return true
		}
	}
}

// Follow keeps a node that holds no replica of group 0 (a cluster with more
// nodes than a group has voters) up to date: every interval it asks group
// 0's leader for the table (PartitionMoves.State of group 0) and learns a
// newer one, then calls onNew with it — how such a node creates the groups
// a raise added (it may be their voter) and routes and answers cluster
// views by the moves' table. A node that hosts group 0 asks nobody. Returns
// when stop closes; a failed ask is retried at the next tick.
func (s *Service) Follow(stop <-chan struct{}, every time.Duration, onNew func(*layout.Table)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if s.port.Hosts(OrderGroup) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		t, err := s.fetch(ctx)
		cancel()
		if err == nil && s.Learn(t) && onNew != nil {
			onNew(t)
		}
	}
}

// fetch asks group 0's leader for its table (nil: the arithmetic).
func (s *Service) fetch(ctx context.Context) (*layout.Table, error) {
	conn, cctx, err := s.port.LeaderConn(ctx, OrderGroup)
	if err != nil {
		return nil, err
	}
	res, err := api.NewPartitionMovesClient(conn).State(cctx, &api.MoveStateRequest{Group: OrderGroup})
	if err != nil || res.GetLayout() == nil {
		return nil, err
	}
	return api.LayoutFromProto(res.GetLayout(), s.partitions)
}

// Owner is the group owning partition p by this node's table.
func (s *Service) Owner(p int) int { return s.Current().GroupOf(p) }

// Route returns the group that decides partition p for a request routed to
// group routed (nil: the client did not say; clients before the table). A
// request routed to a group that does not own p is Unavailable with an
// api.Moved detail: nothing is decided, the client refreshes its layout and
// retries. (The table names only groups this node runs: fsm/layouttable
// refuses others.)
func (s *Service) Route(p int, routed *uint32) (int, error) {
	t := s.Current()
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

// View is the table's wire form for the cluster view: nil while the
// arithmetic is in force. Built once per table; the result is shared and
// must not be modified.
func (s *Service) View() *api.PartitionLayout {
	t := s.Current()
	s.mu.Lock()
	defer s.mu.Unlock()
	if t != s.viewOf {
		s.viewOf, s.viewForm = t, api.LayoutToProto(t)
	}
	return s.viewForm
}

// Propose replaces the table with t, whose epoch must be the current one
// plus one, through group 0's log: this node must lead group 0, and every
// server of group 0 must support the entry's cluster version
// (fsm/layouttable.ClusterVersion). It returns the epoch in force
// afterwards; a table that does not follow the current one is Aborted.
// Errors are gRPC statuses.
func (s *Service) Propose(ctx context.Context, t *layout.Table) (uint64, error) {
	if err := t.Validate(s.partitions); err != nil {
		return 0, status.Error(codes.InvalidArgument, err.Error())
	}
	switch {
	case t.Epoch == 0:
		return 0, status.Error(codes.InvalidArgument, "layout epoch = 0: that is the arithmetic; a new table's epoch is the current one plus one")
	case t.Groups > s.port.Groups():
		return 0, status.Errorf(codes.InvalidArgument, "layout groups = %d: this cluster runs %d groups", t.Groups, s.port.Groups())
	}
	res, err := s.port.Propose(ctx, OrderGroup, fsmlayout.EntrySet, fsmlayout.AppendSet(nil, fsmlayout.Set{Expected: t.Epoch - 1, Table: t}))
	if err != nil {
		return 0, err
	}
	r, ok := res.(fsmlayout.SetResult)
	switch {
	case !ok:
		return 0, status.Errorf(codes.Internal, "layout-set answered %T", res)
	case r.Refused != "":
		return r.Epoch, status.Errorf(codes.Aborted, "layout: %s", r.Refused)
	}
	return r.Epoch, nil
}

// Raise raises the cluster's group count to n through group 0's log (a
// layout-raise entry, fsm/layouttable.RaiseClusterVersion: FailedPrecondition
// naming the servers that lag until every server of group 0 supports it);
// this node must lead group 0. place names the voters of the groups from..n-1
// (cluster.RaiseVoters; element i is group from+i's). It returns the count before the call and the entry's
// result; at the current count nothing is proposed (Changed false). A lower
// or impossible count is InvalidArgument. Errors are gRPC statuses.
func (s *Service) Raise(ctx context.Context, n int, place func(from, to int) [][]raft.Server) (from int, _ fsmlayout.RaiseResult, _ error) {
	cur := s.mod.Current()
	from = cur.Groups
	if _, changed, err := cur.Raise(n); err != nil {
		return from, fsmlayout.RaiseResult{}, status.Errorf(codes.InvalidArgument, "raise groups to %d: %v", n, err)
	} else if !changed {
		return from, fsmlayout.RaiseResult{Epoch: cur.Epoch, Groups: cur.Groups}, nil
	}
	var voters [][]fsmlayout.Voter
	for _, servers := range place(from, n) {
		voters = append(voters, fsmlayout.VotersOf(servers))
	}
	if len(voters) != n-from {
		return from, fsmlayout.RaiseResult{}, status.Errorf(codes.FailedPrecondition, "raise groups to %d: no voters could be placed for groups %d..%d (no alive member with a raft address, or a node started as its cluster's only voter (--dev) has peers: it bootstraps every group it creates alone)", n, from, n-1)
	}
	res, err := s.port.Propose(ctx, OrderGroup, fsmlayout.EntryRaise, fsmlayout.EncodeRaise(fsmlayout.Raise{Groups: n, Voters: voters}))
	if err != nil {
		return from, fsmlayout.RaiseResult{}, err
	}
	r, ok := res.(fsmlayout.RaiseResult)
	switch {
	case !ok:
		return from, r, status.Errorf(codes.Internal, "layout-raise answered %T", res)
	case r.Refused != "":
		// The table changed between the read above and the entry (another
		// raise): the caller may retry.
		return from, r, status.Errorf(codes.Aborted, "raise groups to %d: %s", n, r.Refused)
	}
	return from, r, nil
}

// MovedErr answers a request for partition p asked of group g while p is
// leaving g (its give appended) or gone from it (given, not routed yet):
// Unavailable with a Moved detail carrying this node's table. When that table
// still names g, no leader is named, so the client backs off and asks again:
// the route follows the give within a few commits.
func (s *Service) MovedErr(p, g int) error {
	t := s.Current()
	owner := t.GroupOf(p)
	mv := &api.Moved{Partition: uint32(p), Group: uint32(owner), LayoutEpoch: t.Epoch}
	if owner != g {
		mv.LeaderId, mv.LeaderGrpcAddress = s.leaderOf(owner)
	}
	msg := fmt.Sprintf("partition %d is moving out of group %d (layout epoch %d names group %d); retry shortly", p, g, t.Epoch, owner)
	st, err := status.New(codes.Unavailable, msg).WithDetails(mv)
	if err != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}

// IsMoved reports whether err is a gRPC status with an api.Moved detail (a
// Route or MovedErr answer, possibly from another node).
func IsMoved(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*api.Moved); ok {
			return true
		}
	}
	return false
}
