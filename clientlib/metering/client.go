package metering

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Errors an event can end with (wrapped with the server's reason).
var (
	// ErrConflict: a start on an active target, or an id reused for another
	// event (HTTP 409).
	ErrConflict = errors.New("metering: conflict")
	// ErrUnprocessable: a stop without an active span, a stop before its
	// start, or a timestamp outside the slack window (HTTP 422).
	ErrUnprocessable = errors.New("metering: unprocessable event")
	// ErrInvalid: the event does not follow the schema (HTTP 400).
	ErrInvalid = errors.New("metering: invalid event")
)

// Client sends events over one gRPC connection.
type Client struct {
	c api.MeteringClient
	// Retries of Unavailable answers (leader changes), with backoff; default 5.
	Retries int
}

// New returns a client using cc (the caller owns the connection).
func New(cc grpc.ClientConnInterface) *Client {
	return &Client{c: api.NewMeteringClient(cc), Retries: 5}
}

// Event is a start or stop event (Measures only on start).
type Event struct {
	ID        string
	Timestamp time.Time
	Target    Target
	Measures  map[string]float64
}

// Target correlates starts and stops.
type Target struct {
	OrganizationID, SpaceID, ConsumerID, ResourceID, PlanID, ResourceInstanceID string
}

// Result says whether the server had already accepted this event (same id).
type Result struct {
	Duplicate bool
	SpanID    uint64
}

func (e *Event) proto() *api.MeterEvent {
	p := &api.MeterEvent{Id: e.ID, Timestamp: e.Timestamp.UnixMilli(), Target: &api.MeterTarget{
		OrganizationId: e.Target.OrganizationID, SpaceId: e.Target.SpaceID, ConsumerId: e.Target.ConsumerID,
		ResourceId: e.Target.ResourceID, PlanId: e.Target.PlanID, ResourceInstanceId: e.Target.ResourceInstanceID}}
	for k, v := range e.Measures {
		p.MeasuredUsage = append(p.MeasuredUsage, &api.MeterMeasure{Measure: k, Quantity: v})
	}
	return p
}

// Start opens a span.
func (c *Client) Start(ctx context.Context, e Event) (Result, error) {
	return c.send(ctx, e, c.c.Start)
}

// Stop closes the target's active span.
func (c *Client) Stop(ctx context.Context, e Event) (Result, error) {
	e.Measures = nil
	return c.send(ctx, e, c.c.Stop)
}

func (c *Client) send(ctx context.Context, e Event, call func(context.Context, *api.MeterEvent, ...grpc.CallOption) (*api.MeterEventResponse, error)) (Result, error) {
	req := e.proto()
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		resp, err := call(ctx, req)
		if err == nil {
			return Result{Duplicate: resp.Duplicate, SpanID: resp.SpanId}, nil
		}
		st := status.Convert(err)
		switch st.Code() {
		case codes.AlreadyExists:
			return Result{}, fmt.Errorf("%w: %s", ErrConflict, st.Message())
		case codes.FailedPrecondition:
			return Result{}, fmt.Errorf("%w: %s", ErrUnprocessable, st.Message())
		case codes.InvalidArgument:
			return Result{}, fmt.Errorf("%w: %s", ErrInvalid, st.Message())
		case codes.Unavailable, codes.DeadlineExceeded:
			if attempt >= c.Retries || ctx.Err() != nil {
				return Result{}, fmt.Errorf("metering: %s after %d attempts: %w", st.Message(), attempt+1, err)
			}
		default:
			return Result{}, fmt.Errorf("metering: %w", err)
		}
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("metering: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Query returns ledger records of all groups matching the target fields set
// (empty = any) with timestamps in [from, to).
func (c *Client) Query(ctx context.Context, t Target, from, to time.Time, limit int) ([]*api.UsageRecord, error) {
	req := &api.QueryUsageRequest{Group: -1, Target: &api.MeterTarget{OrganizationId: t.OrganizationID, SpaceId: t.SpaceID, ConsumerId: t.ConsumerID,
		ResourceId: t.ResourceID, PlanId: t.PlanID, ResourceInstanceId: t.ResourceInstanceID}, Limit: uint32(limit)}
	if !from.IsZero() {
		req.From = from.UnixMilli()
	}
	if !to.IsZero() {
		req.To = to.UnixMilli()
	}
	resp, err := c.c.QueryUsage(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("metering query: %w", err)
	}
	return resp.Records, nil
}

// ErrClockLocked: the node was not started with --metering-test-clock, so
// its metering clock cannot be set or advanced (gRPC FailedPrecondition).
var ErrClockLocked = errors.New("metering: the node's clock is not a test clock")

// Clock is a node's metering clock after SetClock.
type Clock struct {
	Now       time.Time
	TestClock bool // the node runs the test clock
}

// SetClock sets (when set is non-nil) and then advances (by advance ≥ 0) the
// metering clock of the node cc is connected to; with neither it only reads
// the clock. It is an admin call: cc must carry the admin token when the
// node has one (metadata "authorization: Bearer <token>"). Only that node's
// clock changes: a test sets every node. A node without the test clock
// answers an error wrapping ErrClockLocked; no call is retried (a retried
// advance could move the clock twice).
func (c *Client) SetClock(ctx context.Context, set *time.Time, advance time.Duration) (Clock, error) {
	req := &api.SetClockRequest{AdvanceMs: advance.Milliseconds()}
	if set != nil {
		ms := set.UnixMilli()
		req.SetMs = &ms
	}
	resp, err := c.c.SetClock(ctx, req)
	if err != nil {
		if st := status.Convert(err); st.Code() == codes.FailedPrecondition {
			return Clock{}, fmt.Errorf("%w: %s", ErrClockLocked, st.Message())
		}
		return Clock{}, fmt.Errorf("metering clock: %w", err)
	}
	return Clock{Now: time.UnixMilli(resp.NowMs), TestClock: resp.TestClock}, nil
}

// BatchEvent is one event of a batch: a start, or a stop when Stop is set.
type BatchEvent struct {
	Stop  bool
	Event Event
}

// BatchResult is one event's answer: Err wraps ErrConflict, ErrUnprocessable
// or ErrInvalid as Start/Stop do, or is a retryable error (leader moving)
// that survived the client's retries.
type BatchResult struct {
	Result
	Err error
}

// Events sends many events in one call (the server splits them by raft
// group and forwards each group's share in one hop). Events whose answer is
// retryable (Unavailable, DeadlineExceeded) are re-sent with the same ids up
// to Retries times; the error return is for the call as a whole.
func (c *Client) Events(ctx context.Context, evs []BatchEvent) ([]BatchResult, error) {
	out := make([]BatchResult, len(evs))
	todo := make([]int, len(evs))
	for i := range todo {
		todo[i] = i
	}
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		req := &api.MeterEventsRequest{Events: make([]*api.MeterEventItem, len(todo))}
		for k, i := range todo {
			req.Events[k] = &api.MeterEventItem{Stop: evs[i].Stop, Event: evs[i].Event.proto()}
		}
		resp, err := c.c.Events(ctx, req)
		if err != nil {
			st := status.Convert(err)
			if (st.Code() != codes.Unavailable && st.Code() != codes.DeadlineExceeded) || attempt >= c.Retries || ctx.Err() != nil {
				return nil, fmt.Errorf("metering: batch of %d events: %w", len(todo), err)
			}
		} else {
			if len(resp.Results) != len(todo) {
				return nil, fmt.Errorf("metering: %d results for %d events", len(resp.Results), len(todo))
			}
			var again []int
			for k, i := range todo {
				r := resp.Results[k]
				switch codes.Code(r.Code) {
				case codes.OK:
					out[i] = BatchResult{Result: Result{Duplicate: r.Response.GetDuplicate(), SpanID: r.Response.GetSpanId()}}
				case codes.AlreadyExists:
					out[i] = BatchResult{Err: fmt.Errorf("%w: %s", ErrConflict, r.Message)}
				case codes.FailedPrecondition:
					out[i] = BatchResult{Err: fmt.Errorf("%w: %s", ErrUnprocessable, r.Message)}
				case codes.InvalidArgument:
					out[i] = BatchResult{Err: fmt.Errorf("%w: %s", ErrInvalid, r.Message)}
				case codes.Unavailable, codes.DeadlineExceeded:
					out[i] = BatchResult{Err: fmt.Errorf("metering: %s after %d attempts", r.Message, attempt+1)}
					again = append(again, i)
				default:
					out[i] = BatchResult{Err: fmt.Errorf("metering: %s: %s", codes.Code(r.Code), r.Message)}
				}
			}
			if len(again) == 0 || attempt >= c.Retries || ctx.Err() != nil {
				return out, nil
			}
			todo = again
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("metering: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
