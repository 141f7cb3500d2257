package clientlib

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// ErrClosed is returned (wrapped in a status with codes.Canceled) by calls made
// after Close, or interrupted by it.
var ErrClosed = errors.New("clientlib: client closed")

// closedErr carries ErrClosed and a Canceled status.
type closedErr struct{}

func (closedErr) Error() string              { return ErrClosed.Error() }
func (closedErr) Unwrap() error              { return ErrClosed }
func (closedErr) GRPCStatus() *status.Status { return status.New(codes.Canceled, ErrClosed.Error()) }

// PartitionError is the final failure of one partition's request. Err is the
// last gRPC error (or the caller's context error as a status), so
// status.Code(err), status.FromError(err) and errors.As work through it.
type PartitionError struct {
	Group     int
	Partition int
	Attempts  int // RPCs sent (0 when the deadline passed first)
	Err       error
}

func (e *PartitionError) Error() string {
	return fmt.Sprintf("clientlib: group %d, partition %d: %d attempt(s): %v", e.Group, e.Partition, e.Attempts, e.Err)
}

func (e *PartitionError) Unwrap() error { return e.Err }

// TrackError is returned by TrackSeries when more than one partition failed.
// Failed is ordered by partition; its first element decides status.Code and
// the start of the message. errors.As and errors.Is see every element.
type TrackError struct {
	Failed []*PartitionError
}

func (e *TrackError) Error() string {
	if len(e.Failed) == 1 {
		return e.Failed[0].Error()
	}
	return fmt.Sprintf("%v (and %d more partition(s) failed)", e.Failed[0], len(e.Failed)-1)
}

func (e *TrackError) Unwrap() []error {
	out := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		out[i] = f
	}
	return out
}

// LayoutError reports a cluster whose layout differs from Config.Partitions /
// Config.Groups (or from the defaults assumed while the servers did not
// implement WatchCluster). Every call fails with it: fix the configuration.
type LayoutError struct {
	ConfigPartitions, ConfigGroups   int
	ClusterPartitions, ClusterGroups int
	ServedBy                         string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("clientlib: cluster layout mismatch: the client uses partitions=%d groups=%d but node %q reports partitions=%d groups=%d; set Config.Partitions and Config.Groups to the cluster's values (or leave them 0 to learn them)",
		e.ConfigPartitions, e.ConfigGroups, e.ServedBy, e.ClusterPartitions, e.ClusterGroups)
}

func (e *LayoutError) GRPCStatus() *status.Status {
	return status.New(codes.FailedPrecondition, e.Error())
}

// invalidArg wraps a client-side validation error with an InvalidArgument status.
type invalidArg struct{ err error }

func (e invalidArg) Error() string              { return "clientlib: " + e.err.Error() }
func (e invalidArg) Unwrap() error              { return e.err }
func (e invalidArg) GRPCStatus() *status.Status { return status.New(codes.InvalidArgument, e.Error()) }

// LeaderHint returns the leader address carried by a NotLeader error (a
// FailedPrecondition status with an api.NotLeader detail), or "". It looks
// through wrapping.
func LeaderHint(err error) string {
	if nl := notLeader(err); nl != nil {
		return nl.LeaderGrpcAddress
	}
	return ""
}

// notLeader returns the NotLeader detail of err, or nil.
func notLeader(err error) *api.NotLeader {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return nil
	}
	for _, d := range st.Details() {
		if nl, ok := d.(*api.NotLeader); ok {
			return nl
		}
	}
	return nil
}

// movedDetail returns the Moved detail of err (an Unavailable status: the
// partition is not owned by the group the request was routed to), or nil.
func movedDetail(err error) *api.Moved {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return nil
	}
	for _, d := range st.Details() {
		if mv, ok := d.(*api.Moved); ok {
			return mv
		}
	}
	return nil
}

// IsFailOpenable reports whether err means Tollgate could not answer (rather
// than that the request was wrong): those are the failures Config.FailOpen
// turns into "no rejections". True for Unavailable, DeadlineExceeded,
// FailedPrecondition (no reachable leader), Aborted, Internal, Unknown and
// Canceled caused by Close; false for InvalidArgument, ResourceExhausted,
// PermissionDenied, Unauthenticated, Unimplemented, a layout mismatch and a
// context canceled by the caller.
func IsFailOpenable(err error) bool {
	var le *LayoutError
	if errors.As(err, &le) {
		return false
	}
	if errors.Is(err, ErrClosed) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.FailedPrecondition, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}
