package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
	"github.com/tollgate-io/tollgate/service/sampling"
	"github.com/tollgate-io/tollgate/service/shares"
)

// The codes are wire behaviour: clientlib redirects on FailedPrecondition
// (following the NotLeader detail), retries Unavailable and a DeadlineExceeded
// shorter than its own, and gives up on anything else.
func TestErrorTableCodes(t *testing.T) {
	want := map[error]codes.Code{
		admission.ErrNotLeader:               codes.FailedPrecondition,
		admission.ErrStepDown:                codes.Unavailable,
		raft.ErrNotLeader:                    codes.Unavailable,
		raft.ErrLeadershipLost:               codes.Unavailable,
		raft.ErrLeadershipTransferInProgress: codes.Unavailable,
		raft.ErrEnqueueTimeout:               codes.Unavailable,
		raft.ErrRaftShutdown:                 codes.Unavailable,
		raftnode.ErrShutdown:                 codes.Unavailable,
		raft.ErrUnsupportedProtocol:          codes.FailedPrecondition,
		fsm.ErrHalted:                        codes.Unavailable,
		fsm.ErrSnapshotMismatch:              codes.FailedPrecondition,
		partitionlimit.ErrFull:               codes.ResourceExhausted,
		partitionlimit.ErrInvalid:            codes.InvalidArgument,
		api.ErrInvalidSketch:                 codes.InvalidArgument,
		sampling.ErrUnknownKind:              codes.FailedPrecondition,
		sampling.ErrInvalidBacklog:           codes.InvalidArgument,
		sampling.ErrInvalidSource:            codes.InvalidArgument,
		sampling.ErrTooManySources:           codes.ResourceExhausted,
		sampling.ErrUnavailable:              codes.Unavailable,
		shares.ErrHeadroomUnreachable:        codes.Unavailable,
		raftnode.ErrDiskWrite:                codes.Unavailable,
		context.DeadlineExceeded:             codes.DeadlineExceeded,
		context.Canceled:                     codes.Canceled,
	}
	for _, r := range errorRules() {
		if _, ok := want[r.err]; !ok {
			t.Errorf("rule for %q has no expectation in this test", r.err)
		}
	}
	for sentinel, code := range want {
		for _, err := range []error{sentinel, fmt.Errorf("group 3 apply: %w", sentinel)} {
			st, _ := status.FromError(raftStatus(3, "add voter", err))
			if st.Code() != code {
				t.Errorf("%q → %s, want %s", err, st.Code(), code)
			}
			if !strings.HasPrefix(st.Message(), "group 3: add voter: "+err.Error()) {
				t.Errorf("message %q does not name the group, the operation and the error", st.Message())
			}
		}
	}
	// The leader path wraps the raft error that ended its session in
	// ErrStepDown; the step-down row must win so the hint says "may or may not".
	lost := fmt.Errorf("%w: %w", admission.ErrStepDown, raft.ErrLeadershipLost)
	if code, hint := codeOf(lost); code != codes.Unavailable || !strings.Contains(hint, "may or may not") {
		t.Errorf("step-down wrapping leadership lost → %s %q", code, hint)
	}
	if code, _ := codeOf(errors.New("disk on fire")); code != codes.Internal {
		t.Errorf("unknown error → %s, want Internal", code)
	}
}

func TestNotLeaderStatus(t *testing.T) {
	st, _ := status.FromError(notLeaderStatus(2, "node-1", "node-3", "10.0.0.3:7400"))
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("code %s, want FailedPrecondition", st.Code())
	}
	var nl *api.NotLeader
	for _, d := range st.Details() {
		if x, ok := d.(*api.NotLeader); ok {
			nl = x
		}
	}
	if nl == nil || nl.Group != 2 || nl.LeaderId != "node-3" || nl.LeaderGrpcAddress != "10.0.0.3:7400" {
		t.Fatalf("NotLeader detail %v, want group 2 led by node-3 at 10.0.0.3:7400", nl)
	}
	if !strings.Contains(st.Message(), "node-3 at 10.0.0.3:7400") {
		t.Errorf("message %q does not name the leader", st.Message())
	}
	// No leader known, or the view still names this node: retry, no redirect.
	for _, leader := range []string{"", "node-1"} {
		if code := status.Code(notLeaderStatus(2, "node-1", leader, "")); code != codes.Unavailable {
			t.Errorf("leader %q: code %s, want Unavailable", leader, code)
		}
	}
}
