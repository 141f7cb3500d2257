package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/service/layouttable"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
	"github.com/tollgate-io/tollgate/service/sampling"
	"github.com/tollgate-io/tollgate/service/shares"
)

// errorRule maps an internal or raft error, matched with errors.Is, to the gRPC
// code a client acts on and a hint saying what to do.
type errorRule struct {
	err  error
	code codes.Code
	hint string
}

// errorRules is the one table from internal and raft errors to gRPC codes (in
// the manner of etcd's rpctypes). The first matching row wins, so a sentinel
// that wraps another (admission.ErrStepDown wraps raft.ErrLeadershipLost) comes
// first. Errors without a row are codes.Internal. Clients rely on the codes:
// FailedPrecondition means "ask another node" (clientlib follows the NotLeader
// detail), Unavailable and DeadlineExceeded mean "retry", and a TrackSeries
// retry is always safe because tracking the same hashes twice is idempotent.
func errorRules() []errorRule {
	return []errorRule{
		{admission.ErrNotLeader, codes.FailedPrecondition, "send it to the group's leader"},
		{admission.ErrStepDown, codes.Unavailable, "it may or may not have been recorded; retry"},
		{raft.ErrNotLeader, codes.Unavailable, "leadership is changing; retry"},
		{raft.ErrLeadershipLost, codes.Unavailable, "it may or may not have been applied; retry"},
		{raft.ErrLeadershipTransferInProgress, codes.Unavailable, "leadership is being transferred; retry"},
		{raft.ErrEnqueueTimeout, codes.Unavailable, "the group's log is saturated; it may or may not have been recorded; retry"},
		{raft.ErrRaftShutdown, codes.Unavailable, "this node is shutting down; retry on another node"},
		{raftnode.ErrShutdown, codes.Unavailable, "this node is shutting down; retry on another node"},
		{raftnode.ErrDiskWrite, codes.Unavailable, "this node's disk refused the write (see /readyz); it hands the group to another node; retry"},
		{raft.ErrUnsupportedProtocol, codes.FailedPrecondition, "a member speaks an unsupported raft protocol version"},
		{fsm.ErrHalted, codes.Unavailable, "this replica halted the group (see /readyz); retry: another node will lead it"},
		{fsm.ErrSnapshotMismatch, codes.FailedPrecondition, "the snapshot was written for another partitions/shards layout"},
		{partitionlimit.ErrFull, codes.ResourceExhausted, "the push changed nothing; see tollgate_sketches_held"},
		{partitionlimit.ErrInvalid, codes.InvalidArgument, "the push changed nothing"},
		{api.ErrInvalidSketch, codes.InvalidArgument, "the push changed nothing"},
		{sampling.ErrUnknownKind, codes.FailedPrecondition, "report the kind the backlog_controller controls"},
		{sampling.ErrInvalidBacklog, codes.InvalidArgument, "the report was not recorded"},
		{sampling.ErrInvalidSource, codes.InvalidArgument, "the report was not recorded"},
		{sampling.ErrTooManySources, codes.ResourceExhausted, "reuse source names"},
		{sampling.ErrUnavailable, codes.Unavailable, "retry"},
		{shares.ErrHeadroomUnreachable, codes.Unavailable, "nothing was rejected below the limit"},
		{context.DeadlineExceeded, codes.DeadlineExceeded, "no reply before the deadline; retry is safe"},
		{context.Canceled, codes.Canceled, ""},
	}
}

// codeOf returns the gRPC code of err and the hint of its row.
func codeOf(err error) (codes.Code, string) {
	for _, r := range errorRules() {
		if errors.Is(err, r.err) {
			return r.code, r.hint
		}
	}
	return codes.Internal, ""
}

// grpcError turns a capability's error into a gRPC status: the code of its
// row, the message and the row's hint.
func grpcError(err error) error {
	code, hint := codeOf(err)
	msg := err.Error()
	if hint != "" {
		msg += "; " + hint
	}
	return status.Error(code, msg)
}

// raftStatus turns an error of an operation on group g into a gRPC status
// naming the group and the operation.
func raftStatus(g int, what string, err error) error {
	code, hint := codeOf(err)
	msg := fmt.Sprintf("group %d: %s: %v", g, what, err)
	if hint != "" {
		msg += "; " + hint
	}
	return status.Error(code, msg)
}

// trackError maps an error of the leader path to a gRPC status. NotLeader gets
// the detail naming the leader so clients redirect without another lookup.
// Called only on failures, so its checks cost the hot path nothing.
func (s *Server) trackError(g int, err error) error {
	if layouttable.IsMoved(err) {
		return err // the fence of a partition hand-off (partmoves.go): retry at the new owner
	}
	if errors.Is(err, admission.ErrNotLeader) {
		// A node that raft made leader of a group its FSM halted runs no
		// session (mayLead): say why instead of naming itself as leader.
		if err := s.haltedLeaderStatus(g); err != nil {
			return err
		}
		id, addr := s.leaderOf(g)
		if id == s.cfg.Node.ID {
			// Raft's leader, but its clock is not confirmed: it runs no
			// session and is handing the group away.
			if why := s.clock.OutOfBound(); why != "" {
				return status.Errorf(codes.Unavailable, "group %d: this node holds raft leadership but may not lead: %s; retry", g, why)
			}
		}
		return notLeaderStatus(g, s.cfg.Node.ID, id, addr)
	}
	return raftStatus(g, "track series", err)
}

// notLeaderStatus builds FailedPrecondition with a NotLeader detail naming
// leaderID, or Unavailable when no leader is known or the view still names this
// node while it steps down: either way the client should retry shortly.
func notLeaderStatus(g int, selfID, leaderID, leaderAddr string) error {
	if leaderID == "" || leaderID == selfID {
		return status.Errorf(codes.Unavailable, "group %d has no leader at the moment; retry", g)
	}
	nl := &api.NotLeader{Group: uint32(g), LeaderId: leaderID, LeaderGrpcAddress: leaderAddr}
	msg := fmt.Sprintf("this node does not lead group %d; leader is %s", g, leaderID)
	if leaderAddr != "" {
		msg += " at " + leaderAddr
	}
	st, err := status.New(codes.FailedPrecondition, msg).WithDetails(nl)
	if err != nil {
		return status.Error(codes.FailedPrecondition, msg)
	}
	return st.Err()
}
