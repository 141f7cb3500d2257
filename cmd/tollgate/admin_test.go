package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Admin calls are retried through leader changes (Unavailable, NotLeader) and
// not retried for errors about the request itself.
func TestRetryCallThroughLeaderChanges(t *testing.T) {
	notLeader, err := status.New(codes.FailedPrecondition, "not leader").WithDetails(&api.NotLeader{LeaderGrpcAddress: "x"})
	if err != nil {
		t.Fatal(err)
	}
	errs := []error{status.Error(codes.Unavailable, "election"), notLeader.Err(), nil}
	calls := 0
	v, err := retryCall(context.Background(), func(context.Context) (int, error) {
		e := errs[calls]
		calls++
		return calls, e
	})
	if err != nil || v != 3 || calls != 3 {
		t.Fatalf("v=%d calls=%d err=%v", v, calls, err)
	}

	for _, e := range []error{status.Error(codes.FailedPrecondition, "last voter"), status.Error(codes.InvalidArgument, "bad group"), status.Error(codes.Unauthenticated, "token")} {
		calls = 0
		_, err := retryCall(context.Background(), func(context.Context) (int, error) { calls++; return 0, e })
		if calls != 1 || err != e {
			t.Errorf("%v: %d calls, err %v", e, calls, err)
		}
	}

	// Within the deadline only: a cancelled context ends the retries with the
	// last error.
	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	_, err = retryCall(ctx, func(context.Context) (int, error) {
		calls++
		if calls == 2 {
			cancel()
		}
		return 0, status.Error(codes.Unavailable, "no leader")
	})
	if err == nil || !strings.Contains(err.Error(), "no leader") || !strings.Contains(err.Error(), "gave up after") {
		t.Fatalf("err = %v", err)
	}
}

// TestRetryCallTransferTimeout: `raft transfer-leadership` asks again when
// the target did not take over in time ("leadership transfer timeout", which
// earlier servers answered as Internal and newer ones as Unavailable); other
// Internal errors are not retried.
func TestRetryCallTransferTimeout(t *testing.T) {
	errs := []error{
		status.Error(codes.Internal, "group 2: transfer leadership: leadership transfer timeout"),
		status.Error(codes.Unavailable, "group 2: transfer leadership: leadership transfer timeout: the target did not take over in time and this node still leads; retry"),
		nil,
	}
	calls := 0
	v, err := retryCall(context.Background(), func(context.Context) (int, error) {
		e := errs[calls]
		calls++
		return calls, e
	})
	if err != nil || v != 3 || calls != 3 {
		t.Fatalf("v=%d calls=%d err=%v", v, calls, err)
	}
	calls = 0
	other := status.Error(codes.Internal, "group 2: transfer leadership: something else")
	if _, err := retryCall(context.Background(), func(context.Context) (int, error) { calls++; return 0, other }); calls != 1 || err != other {
		t.Errorf("%v: %d calls, err %v", other, calls, err)
	}
}

// status fails for an unreachable voter (a killed node that still holds
// replicas), marks it and its stale leaderships, and lets pass members that
// left or that no group counts as a voter (removed after they died).
func TestStatusUnreachableVoters(t *testing.T) {
	st := &api.StatusResponse{
		View: &api.ClusterView{
			Members: []*api.Member{
				{Id: "n1", Zone: "a", Status: "alive"}, {Id: "n2", Zone: "b", Status: "alive"},
				{Id: "n3", Zone: "c", Status: "failed"}, {Id: "n4", Zone: "c", Status: "left"},
			},
			GroupInfo: []*api.GroupInfo{{Group: 0, LeaderId: "n2", Voters: []string{"n1", "n2", "n4"}}},
		},
		Unreachable: []string{"n2", "n3", "n4"},
	}
	if got := unreachable(st); fmt.Sprint(got) != "[n2]" {
		t.Fatalf("unreachable %v, want [n2]: n3 holds no replica, n4 left", got)
	}
	if err := unreachableError(unreachable(st)); err == nil || !strings.Contains(err.Error(), "n2") {
		t.Fatalf("error %v, want one naming n2", err)
	}
	var out strings.Builder
	printStatus(&out, st)
	if !regexp.MustCompile(`(?m)^b\s+n2\s+unreachable\s`).MatchString(out.String()) || !strings.Contains(out.String(), "n2 (unreachable)") ||
		!strings.Contains(out.String(), "UNREACHABLE: n2") {
		t.Fatalf("status output does not mark n2:\n%s", out.String())
	}
}
