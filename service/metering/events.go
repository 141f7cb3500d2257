package metering

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/tenantscope"
)

// EventDoc is the JSON document of POST /v1/events/start|stop.
type EventDoc struct {
	ID                 string       `json:"id,omitempty"`
	Timestamp          *int64       `json:"timestamp"`
	OrganizationID     string       `json:"organization_id"`
	SpaceID            string       `json:"space_id"`
	ConsumerID         string       `json:"consumer_id"`
	ResourceID         string       `json:"resource_id"`
	PlanID             string       `json:"plan_id"`
	ResourceInstanceID string       `json:"resource_instance_id"`
	MeasuredUsage      []MeasureDoc `json:"measured_usage,omitempty"`
}

// MeasureDoc is one entry of measured_usage.
type MeasureDoc struct {
	Measure  string   `json:"measure"`
	Quantity *float64 `json:"quantity"`
}

// schemaError is a 400 naming the field.
type schemaError struct{ field, msg string }

func (e *schemaError) Error() string { return fmt.Sprintf("field %s: %s", e.field, e.msg) }

func checkID(field, v string, required bool) error {
	switch {
	case v == "" && required:
		return &schemaError{field, "required, a non-empty string"}
	case len(v) > fsmmeter.MaxIDLen:
		return &schemaError{field, fmt.Sprintf("%d bytes, at most %d", len(v), fsmmeter.MaxIDLen)}
	case !utf8.ValidString(v):
		return &schemaError{field, "not valid UTF-8"}
	}
	return nil
}

// validateEvent checks an event against the schema of its kind.
func validateEvent(kind fsmmeter.Kind, ev *fsmmeter.Event, hasTimestamp bool) error {
	if err := checkID("id", ev.ID, false); err != nil {
		return err
	}
	if !hasTimestamp {
		return &schemaError{"timestamp", "required, Unix milliseconds"}
	}
	if ev.Timestamp <= 0 || ev.Timestamp > 1<<50 {
		return &schemaError{"timestamp", fmt.Sprintf("%d is not a plausible Unix time in milliseconds", ev.Timestamp)}
	}
	names := [6]string{"organization_id", "space_id", "consumer_id", "resource_id", "plan_id", "resource_instance_id"}
	for i, v := range ev.Target.Fields() {
		if err := checkID(names[i], v, true); err != nil {
			return err
		}
	}
	switch kind {
	case fsmmeter.Start:
		if len(ev.Measures) == 0 {
			return &schemaError{"measured_usage", "required for a start event: at least one {measure, quantity}"}
		}
		if len(ev.Measures) > fsmmeter.MaxMeasures {
			return &schemaError{"measured_usage", fmt.Sprintf("%d measures, at most %d", len(ev.Measures), fsmmeter.MaxMeasures)}
		}
		seen := map[string]bool{}
		for i, m := range ev.Measures {
			f := fmt.Sprintf("measured_usage[%d].measure", i)
			if err := checkID(f, m.Name, true); err != nil {
				return err
			}
			if m.Name == "duration" {
				return &schemaError{f, `"duration" is reserved: the sampler adds it`}
			}
			if seen[m.Name] {
				return &schemaError{f, fmt.Sprintf("measure %q twice", m.Name)}
			}
			seen[m.Name] = true
			if math.IsNaN(m.Quantity) || math.IsInf(m.Quantity, 0) {
				return &schemaError{fmt.Sprintf("measured_usage[%d].quantity", i), "must be a finite number"}
			}
			if m.Quantity < 0 {
				return &schemaError{fmt.Sprintf("measured_usage[%d].quantity", i), fmt.Sprintf("%v is negative; a measured quantity is 0 or more", m.Quantity)}
			}
		}
	case fsmmeter.Stop:
		if len(ev.Measures) > 0 {
			return &schemaError{"measured_usage", "a stop event carries no measured_usage"}
		}
	}
	return nil
}

// decodeDoc reads the request body: 415 unless JSON, 413 when too large, 400
// naming the field for schema errors (and for bytes that are not UTF-8).
func (s *Service) decodeDoc(w http.ResponseWriter, r *http.Request, kind fsmmeter.Kind) (fsmmeter.Event, int, error) {
	if e := httpjson.RequireJSON(r); e != nil {
		return fsmmeter.Event{}, e.Status, e
	}
	body, e := httpjson.ReadBody(w, r, s.cfg.MaxBody)
	if e != nil {
		return fsmmeter.Event{}, e.Status, e
	}
	return decodeEventJSON(body, kind, false)
}

// decodeEventJSON decodes and checks one event document; inBatch allows the
// batch item's "kind" field. Invalid UTF-8 is refused before decoding:
// encoding/json would turn every bad byte into U+FFFD, so "inst-\xff" and
// "inst-\xfe" would become one resource.
func decodeEventJSON(body []byte, kind fsmmeter.Kind, inBatch bool) (fsmmeter.Event, int, error) {
	var ev fsmmeter.Event
	if e := httpjson.CheckUTF8(body); e != nil {
		return ev, e.Status, e
	}
	if !json.Valid(body) {
		return ev, http.StatusUnsupportedMediaType, errors.New("the body is not JSON")
	}
	var item BatchItemDoc
	doc := &item.EventDoc
	var target any = doc
	if inBatch {
		target = &item
	}
	if e := httpjson.DecodeObject(body, target); e != nil {
		return ev, e.Status, e
	}
	ev = fsmmeter.Event{Kind: kind, ID: doc.ID, Target: fsmmeter.Target{Org: doc.OrganizationID, Space: doc.SpaceID, Consumer: doc.ConsumerID,
		Resource: doc.ResourceID, Plan: doc.PlanID, Instance: doc.ResourceInstanceID}}
	if doc.Timestamp != nil {
		ev.Timestamp = *doc.Timestamp
	}
	for i, m := range doc.MeasuredUsage {
		if m.Quantity == nil {
			return ev, http.StatusBadRequest, &schemaError{fmt.Sprintf("measured_usage[%d].quantity", i), "required, a number"}
		}
		ev.Measures = append(ev.Measures, fsmmeter.Measure{Name: m.Measure, Quantity: *m.Quantity})
	}
	if err := validateEvent(kind, &ev, doc.Timestamp != nil); err != nil {
		return ev, http.StatusBadRequest, err
	}
	return ev, 0, nil
}

func (s *Service) handleEvent(kind fsmmeter.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ev, code, err := s.decodeDoc(w, r, kind)
		if err == nil {
			// The tenant the handler parsed is the one the credential
			// must allow (tenantscope): the node's access check only
			// authenticated the caller, before the body was read.
			if err = tenantscope.Check(r.Context(), "organization_id", ev.Target.Org); err != nil {
				code, err = http.StatusForbidden, errors.New(status.Convert(err).Message())
			}
		}
		if err != nil {
			s.metrics.events.WithLabelValues(kindLabel(kind), fmt.Sprint(code)).Inc()
			writeError(w, code, err.Error())
			return
		}
		resp, err := s.Submit(forward.FromHTTP(r), ev)
		code = httpCode(err)
		s.metrics.events.WithLabelValues(kindLabel(kind), fmt.Sprint(code)).Inc()
		if err != nil {
			writeError(w, code, status.Convert(err).Message())
			return
		}
		out := map[string]any{"status": "created", "span_id": resp.SpanId, "group": resp.Group}
		if resp.Duplicate {
			out["status"] = "duplicate"
		}
		s.writeJSON(w, http.StatusCreated, out)
	}
}

func kindLabel(k fsmmeter.Kind) string {
	if k == fsmmeter.Start {
		return "start"
	}
	return "stop"
}

// httpCode maps a Submit error to the REST status.
func httpCode(err error) int {
	switch status.Code(err) {
	case codes.OK:
		return http.StatusCreated
	case codes.AlreadyExists:
		return http.StatusConflict
	case codes.FailedPrecondition:
		return http.StatusUnprocessableEntity
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout
	}
	return readCode(err)
}

// readCode maps an error of a read (and the rest of httpCode's) to the
// REST status: the caller's faults (a credential the group leader refused,
// a bad argument) are 4xx, never a 503 that tells the client to retry what
// will never succeed; the service's state is 503.
func readCode(err error) int {
	switch status.Code(err) {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unauthenticated: // the group leader refused the forwarded caller
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	}
	return http.StatusServiceUnavailable
}

// writeJSON encodes v before answering: an answer that cannot be encoded
// is a logged 500, never a 200 with an empty body.
func (s *Service) writeJSON(w http.ResponseWriter, code int, v any) {
	httpjson.Write(w, s.cfg.Logger, code, v)
}

func writeError(w http.ResponseWriter, code int, msg string) { httpjson.WriteError(w, code, msg) }

// Submit records one event: on the leader of the target's group through the
// batcher, elsewhere by forwarding it to that leader once.
func (s *Service) Submit(ctx context.Context, ev fsmmeter.Event) (*api.MeterEventResponse, error) {
	// One event is a batch of one: the same routing, and the same re-routing
	// of a partition whose metering moved (SubmitBatch).
	o := s.SubmitBatch(ctx, []fsmmeter.Event{ev})[0]
	return o.resp, o.err
}

// checkFuture refuses (InvalidArgument naming the field) an event whose
// timestamp is more than MaxFuture ahead of the node's metering clock. A
// node on the test clock (development and tests) does not: its clock is
// set and advanced by hand, and its clients script events ahead of it.
func (s *Service) checkFuture(ev *fsmmeter.Event) error {
	if s.cfg.TestClock {
		return nil
	}
	now := s.clock.Now()
	if ahead := ev.Timestamp - now; ahead > s.cfg.MaxFuture.Milliseconds() {
		return status.Errorf(codes.InvalidArgument, "field timestamp: %d is %v ahead of this node's clock (%d), at most %v: check the client's clock",
			ev.Timestamp, time.Duration(ahead)*time.Millisecond, now, s.cfg.MaxFuture)
	}
	return nil
}

// movedPrefix starts the message of a Moved answer (isMoved).
const movedPrefix = "moved: "

func resultToResponse(g int, r fsmmeter.Result) (*api.MeterEventResponse, error) {
	switch r.Code {
	case fsmmeter.Created:
		return &api.MeterEventResponse{SpanId: r.Span, Group: uint32(g)}, nil
	case fsmmeter.Duplicate:
		return &api.MeterEventResponse{Duplicate: true, Group: uint32(g)}, nil
	case fsmmeter.Conflict:
		return nil, status.Error(codes.AlreadyExists, "conflict: "+r.Reason)
	case fsmmeter.Unprocessable:
		return nil, status.Error(codes.FailedPrecondition, "unprocessable: "+r.Reason)
	case fsmmeter.Moved:
		// Nothing was recorded: the event belongs to the group the
		// partition moved to, and a retry is routed there.
		return nil, status.Error(codes.Unavailable, movedPrefix+r.Reason)
	}
	return nil, status.Errorf(codes.Internal, "unknown event outcome %d", r.Code)
}

func eventToProto(ev *fsmmeter.Event) *api.MeterEvent {
	p := &api.MeterEvent{Id: ev.ID, Timestamp: ev.Timestamp, Target: targetToProto(ev.Target)}
	for _, m := range ev.Measures {
		p.MeasuredUsage = append(p.MeasuredUsage, &api.MeterMeasure{Measure: m.Name, Quantity: m.Quantity})
	}
	return p
}

func targetToProto(t fsmmeter.Target) *api.MeterTarget {
	return &api.MeterTarget{OrganizationId: t.Org, SpaceId: t.Space, ConsumerId: t.Consumer, ResourceId: t.Resource, PlanId: t.Plan, ResourceInstanceId: t.Instance}
}

func targetFromProto(t *api.MeterTarget) fsmmeter.Target {
	if t == nil {
		return fsmmeter.Target{}
	}
	return fsmmeter.Target{Org: t.OrganizationId, Space: t.SpaceId, Consumer: t.ConsumerId, Resource: t.ResourceId, Plan: t.PlanId, Instance: t.ResourceInstanceId}
}

func eventFromProto(kind fsmmeter.Kind, p *api.MeterEvent) (fsmmeter.Event, error) {
	ev := fsmmeter.Event{Kind: kind, ID: p.GetId(), Timestamp: p.GetTimestamp(), Target: targetFromProto(p.GetTarget())}
	for _, m := range p.GetMeasuredUsage() {
		ev.Measures = append(ev.Measures, fsmmeter.Measure{Name: m.Measure, Quantity: m.Quantity})
	}
	if err := validateEvent(kind, &ev, p.GetTimestamp() != 0); err != nil {
		return ev, status.Error(codes.InvalidArgument, err.Error())
	}
	return ev, nil
}

// batcher gathers a group's events into raft entries: one entry per batch,
// several batches in flight.
type batcher struct {
	s   *Service
	g   int
	in  chan *pendingEvent
	sem chan struct{}
}

type pendingEvent struct {
	ev   fsmmeter.Event
	res  fsmmeter.Result
	err  error
	done chan struct{}
}

const (
	batchersInFlight = 8
	proposeTimeout   = 10 * time.Second
)

func (b *batcher) submit(ctx context.Context, ev fsmmeter.Event) (fsmmeter.Result, error) {
	p := &pendingEvent{ev: ev, done: make(chan struct{})}
	select {
	case b.in <- p:
	case <-ctx.Done():
		return fsmmeter.Result{}, status.FromContextError(ctx.Err()).Err()
	case <-b.s.stop:
		return fsmmeter.Result{}, status.Error(codes.Unavailable, "node is shutting down; retry on another node")
	}
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		return fsmmeter.Result{}, status.Errorf(codes.DeadlineExceeded, "%v before the event was recorded; it may still be (retrying with the same id is safe)", ctx.Err())
	}
}

func (b *batcher) loop() {
	defer b.s.wg.Done()
	for {
		var first *pendingEvent
		select {
		case first = <-b.in:
		case <-b.s.stop:
			return
		}
		batch := []*pendingEvent{first}
	drain:
		for len(batch) < b.s.cfg.BatchMax {
			select {
			case p := <-b.in:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		select {
		case b.sem <- struct{}{}:
		case <-b.s.stop:
			for _, p := range batch {
				p.err = status.Error(codes.Unavailable, "node is shutting down; retry")
				close(p.done)
			}
			return
		}
		b.s.wg.Add(1)
		go func() {
			defer b.s.wg.Done()
			defer func() { <-b.sem }()
			b.propose(batch)
		}()
	}
}

func (b *batcher) propose(batch []*pendingEvent) {
	evs := make([]fsmmeter.Event, len(batch))
	for i, p := range batch {
		evs[i] = p.ev
	}
	payload := fsmmeter.EncodeEvents(b.s.clock.NowIn(b.g), b.s.cfg.Slack.Milliseconds(), evs)
	ctx, cancel := context.WithTimeout(context.Background(), proposeTimeout)
	defer cancel()
	resp, err := b.s.host.Propose(ctx, b.g, fsmmeter.EntryEvents, payload)
	if err != nil && status.Code(err) != codes.DeadlineExceeded {
		// Whatever kept the entry out of the log (leadership moving, the
		// cluster-version gate during an upgrade, a halted replica) is the
		// service's state, not the event's: retry, never 4xx.
		err = status.Error(codes.Unavailable, status.Convert(err).Message())
	}
	var res []fsmmeter.Result
	if err == nil {
		var ok bool
		if res, ok = resp.([]fsmmeter.Result); !ok || len(res) != len(batch) {
			err = status.Errorf(codes.Internal, "group %d: unexpected metering response %T", b.g, resp)
		}
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.res = res[i]
		}
		close(p.done)
	}
}
