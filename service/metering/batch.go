package metering

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/tenantscope"
)

// MaxBatchEvents bounds the events of one batch call (REST or gRPC).
const MaxBatchEvents = 10_000

// maxBatchBody bounds a REST batch body.
const maxBatchBody = 16 << 20

// batchOutcome is one event's answer in a batch: resp when err is nil.
type batchOutcome struct {
	resp *api.MeterEventResponse
	err  error
	// unsent: err came before the event left this node (no leader of its
	// group was known), so sending it again cannot record it twice.
	unsent bool
}

// SubmitBatch records many events and answers each on its own. Events are
// split by raft group: a group this node leads goes straight into its
// batcher (all of them queued before any is awaited, so they share entries),
// every other group's share goes in one forwarded call to its leader. Why
// not one call per event: the per-call gRPC cost and the forward hop were
// the largest costs of the single-event path.
//
// A target's metering is in the group the layout table gives its partition
// (Host.GroupOf), or, for a partition whose series a build without metering
// moves handed on, still in its home group (Host.HomeOf); a group that does
// not hold it answers Moved and records nothing. An event answered Moved is
// sent to the other group, then, while a move is between its give and its
// route, to the table's owner again after a pause, until ctx ends or
// movedTries. A call another node forwarded here tries only the groups this
// node leads and returns Moved to the forwarder, which carries on.
//
// An event whose group has no leader known here (an election, a leadership
// hand-off the node has not seen yet) is held and sent again after the same
// pauses, within the same bound, rather than answered Unavailable at once:
// an election lasts a few hundred milliseconds, and a client's retry would
// cost more than the wait. Only events that never left the node are held
// (batchOutcome.unsent); one that reached a leader and failed there may be
// recorded, and its answer goes back as it came. A node another node
// forwarded an event to, and which knows no leader either (it has just
// lost the leadership), answers it with notSentPrefix, so the forwarder,
// which cannot tell otherwise, holds it too.
func (s *Service) SubmitBatch(ctx context.Context, evs []fsmmeter.Event) []batchOutcome {
	out := make([]batchOutcome, len(evs))
	groups := make([]int, len(evs))
	fwd := forward.Was(ctx)
	if fwd {
		defer markNotSent(out) // the forwarder holds them (out shares its array)
	}
	var idx []int
	for i := range evs {
		if err := s.checkFuture(&evs[i]); err != nil {
			out[i].err = err
			continue
		}
		h := fsmmeter.TargetHash(evs[i].Target)
		g := s.host.GroupOf(h)
		if home := s.host.HomeOf(h); fwd && home != g && !s.host.Leads(g) && s.host.Leads(home) {
			g = home // the forwarder tried the owner already
		}
		groups[i] = g
		idx = append(idx, i)
	}
	pause := 10 * time.Millisecond
	for try := 0; len(idx) > 0; try++ {
		s.submitTo(ctx, evs, idx, groups, out)
		moved := idx[:0:0]
		wait, held := false, 0
		for _, i := range idx {
			if out[i].unsent && !fwd {
				wait, held = true, held+1
				moved = append(moved, i)
				continue
			}
			if !isMoved(out[i].err) {
				continue
			}
			h := fsmmeter.TargetHash(evs[i].Target)
			owner, home := s.host.GroupOf(h), s.host.HomeOf(h)
			switch {
			case groups[i] != home && (!fwd || s.host.Leads(home)):
				groups[i] = home
			case fwd:
				continue // the forwarder retries
			default:
				groups[i], wait = owner, true
			}
			moved = append(moved, i)
		}
		if len(moved) == 0 || try+1 >= movedTries {
			return out
		}
		if wait {
			select {
			case <-ctx.Done():
				return out
			case <-s.stop:
				return out
			case <-time.After(pause):
			}
			pause = min(2*pause, 200*time.Millisecond)
		}
		s.metrics.movedRetries.Add(float64(len(moved) - held))
		s.metrics.leaderWaits.Add(float64(held))
		for _, i := range moved {
			out[i] = batchOutcome{}
		}
		idx = moved
	}
	return out
}

// movedTries bounds the rounds of SubmitBatch for events answered Moved
// (about 5 s of pauses): a move holds a partition's events for one give,
// one receive and one layout commit.
const movedTries = 32

// notSentPrefix starts the message of an event a forwarded call answers
// without having sent it anywhere (no leader of its group known there): the
// forwarder may send it again without risking a second record.
const notSentPrefix = "not sent: "

// markNotSent gives the unsent events' errors the notSentPrefix.
func markNotSent(out []batchOutcome) {
	for i := range out {
		if out[i].unsent && out[i].err != nil {
			st := status.Convert(out[i].err)
			out[i].err = status.Error(st.Code(), notSentPrefix+st.Message())
		}
	}
}

// isNotSent reports whether err is a forwarded answer marked notSentPrefix.
func isNotSent(err error) bool { return unavailableWith(err, notSentPrefix) }

// isMoved reports whether err is a Moved answer (resultToResponse), local or
// forwarded.
func isMoved(err error) bool { return unavailableWith(err, movedPrefix) }

// unavailableWith reports whether err is Unavailable with a message that
// starts with prefix: the marks one node's answers carry to another.
func unavailableWith(err error, prefix string) bool {
	st, ok := status.FromError(err)
	return ok && err != nil && st.Code() == codes.Unavailable && strings.HasPrefix(st.Message(), prefix)
}

// submitTo sends each event evs[i], i in idx, to group groups[i].
func (s *Service) submitTo(ctx context.Context, evs []fsmmeter.Event, idx, groups []int, out []batchOutcome) {
	byGroup := map[int][]int{}
	for _, i := range idx {
		byGroup[groups[i]] = append(byGroup[groups[i]], i)
	}
	if len(byGroup) == 1 { // a single event, or one group's: no goroutine
		for g, idx := range byGroup {
			s.submitGroup(ctx, g, evs, idx, out)
		}
		return
	}
	var wg sync.WaitGroup
	for g, idx := range byGroup {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.submitGroup(ctx, g, evs, idx, out)
		}()
	}
	wg.Wait()
}

// submitGroup sends group g's events: into its batcher when this node
// leads it, else in one call forwarded to its leader.
func (s *Service) submitGroup(ctx context.Context, g int, evs []fsmmeter.Event, idx []int, out []batchOutcome) {
	if s.host.Leads(g) {
		b, err := s.batcherOf(g)
		if err != nil {
			for _, i := range idx {
				out[i].err = err
			}
			return
		}
		if len(idx) == 1 { // the single-event path: no waves
			i := idx[0]
			res, err := b.submit(ctx, evs[i])
			if err != nil {
				out[i].err = err
			} else {
				out[i].resp, out[i].err = resultToResponse(g, res)
			}
			return
		}
		b.submitMany(ctx, evs, idx, out)
		return
	}
	s.forwardBatch(ctx, g, evs, idx, out)
}

// submitMany queues the events evs[idx] and waits for their answers. Events
// of one target are applied in request order: the batcher may propose its
// entries concurrently, so the k-th event of each target goes in wave k,
// queued only once wave k-1 has been answered.
func (b *batcher) submitMany(ctx context.Context, evs []fsmmeter.Event, idx []int, out []batchOutcome) {
	seen := map[fsmmeter.Target]int{}
	var waves [][]int
	for _, i := range idx {
		k := seen[evs[i].Target]
		seen[evs[i].Target] = k + 1
		if k == len(waves) {
			waves = append(waves, nil)
		}
		waves[k] = append(waves[k], i)
	}
	for _, w := range waves {
		b.submitWave(ctx, evs, w, out)
	}
}

func (b *batcher) submitWave(ctx context.Context, evs []fsmmeter.Event, idx []int, out []batchOutcome) {
	ps := make([]*pendingEvent, 0, len(idx))
	var fail error
	for _, i := range idx {
		p := &pendingEvent{ev: evs[i], done: make(chan struct{})}
		select {
		case b.in <- p:
			ps = append(ps, p)
			continue
		case <-ctx.Done():
			fail = status.FromContextError(ctx.Err()).Err()
		case <-b.s.stop:
			fail = status.Error(codes.Unavailable, "node is shutting down; retry on another node")
		}
		break
	}
	for k, i := range idx {
		if k >= len(ps) {
			out[i].err = fail
			continue
		}
		p := ps[k]
		select {
		case <-p.done:
			if p.err != nil {
				out[i].err = p.err
			} else {
				out[i].resp, out[i].err = resultToResponse(b.g, p.res)
			}
		case <-ctx.Done():
			out[i].err = status.Errorf(codes.DeadlineExceeded, "%v before the event was recorded; it may still be (retrying with the same id is safe)", ctx.Err())
		}
	}
}

func (s *Service) forwardBatch(ctx context.Context, g int, evs []fsmmeter.Event, idx []int, out []batchOutcome) {
	fail := func(err error) {
		for _, i := range idx {
			out[i].err = err
		}
	}
	cc, fctx, err := s.host.LeaderConn(ctx, g) // at most once (nodeport)
	if err != nil {
		fail(err)
		for _, i := range idx {
			out[i].unsent = true
		}
		return
	}
	req := &api.MeterEventsRequest{Events: make([]*api.MeterEventItem, len(idx))}
	for k, i := range idx {
		req.Events[k] = &api.MeterEventItem{Stop: evs[i].Kind == fsmmeter.Stop, Event: eventToProto(&evs[i])}
	}
	resp, err := api.NewMeteringClient(cc).Events(fctx, req)
	if err == nil && len(resp.Results) != len(idx) {
		err = status.Errorf(codes.Internal, "group %d: its leader answered %d results for %d events", g, len(resp.Results), len(idx))
	}
	if err != nil {
		st := status.Convert(err)
		if st.Code() != codes.DeadlineExceeded && st.Code() != codes.Internal {
			err = status.Errorf(codes.Unavailable, "group %d: forward to its leader: %s; retry", g, st.Message())
		}
		fail(err)
		return
	}
	for k, i := range idx {
		r := resp.Results[k]
		if codes.Code(r.Code) == codes.OK {
			out[i].resp = r.Response
		} else {
			out[i].err = status.Error(codes.Code(r.Code), r.Message)
			out[i].unsent = isNotSent(out[i].err)
		}
	}
}

// Events is the batch gRPC call: per-event results, in order.
func (g *grpcService) Events(ctx context.Context, req *api.MeterEventsRequest) (*api.MeterEventsResponse, error) {
	if len(req.Events) > MaxBatchEvents {
		return nil, status.Errorf(codes.ResourceExhausted, "%d events in one call, at most %d", len(req.Events), MaxBatchEvents)
	}
	resp := &api.MeterEventsResponse{Results: make([]*api.MeterEventResult, len(req.Events))}
	var evs []fsmmeter.Event
	var pos []int
	for i, it := range req.Events {
		kind := fsmmeter.Start
		if it.Stop {
			kind = fsmmeter.Stop
		}
		ev, err := eventFromProto(kind, it.GetEvent())
		if err != nil {
			g.s.metrics.events.WithLabelValues(kindLabel(kind), "400").Inc()
			resp.Results[i] = &api.MeterEventResult{Code: uint32(codes.InvalidArgument), Message: status.Convert(err).Message()}
			continue
		}
		evs = append(evs, ev)
		pos = append(pos, i)
	}
	for k, o := range g.s.SubmitBatch(ctx, evs) {
		g.s.metrics.events.WithLabelValues(kindLabel(evs[k].Kind), itoa(httpCode(o.err))).Inc()
		r := &api.MeterEventResult{Response: o.resp}
		if o.err != nil {
			st := status.Convert(o.err)
			r = &api.MeterEventResult{Code: uint32(st.Code()), Message: st.Message()}
		}
		resp.Results[pos[k]] = r
	}
	return resp, nil
}

// BatchItemDoc is one event of POST /v1/events: an event document plus its kind.
type BatchItemDoc struct {
	Kind string `json:"kind"` // "start" or "stop"
	EventDoc
}

// BatchResultDoc is one event's answer in POST /v1/events: status is the HTTP
// code the single-event endpoint would have answered.
type BatchResultDoc struct {
	Status int    `json:"status"`
	Result string `json:"result,omitempty"` // created or duplicate
	SpanID uint64 `json:"span_id,omitempty"`
	Group  uint32 `json:"group"`
	Error  string `json:"error,omitempty"`
}

// handleBatch is POST /v1/events: {"events": [{"kind": "start", …}, …]}.
// The answer is 200 with one result per event, in order, unless the body as
// a whole is unusable (415, 413, 400).
func (s *Service) handleBatch(w http.ResponseWriter, r *http.Request) {
	if e := httpjson.RequireJSON(r); e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	body, e := httpjson.ReadBody(w, r, maxBatchBody) // refuses invalid UTF-8 before decoding
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	var req struct {
		Events []json.RawMessage `json:"events"`
	}
	if e := httpjson.DecodeObject(body, &req); e != nil {
		e.Msg += ` (want {"events": [...]})`
		httpjson.WriteErr(w, e)
		return
	}
	if len(req.Events) > MaxBatchEvents {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%d events in one call, at most %d", len(req.Events), MaxBatchEvents))
		return
	}
	results := make([]BatchResultDoc, len(req.Events))
	var evs []fsmmeter.Event
	var pos []int
	for i, raw := range req.Events {
		var kind struct {
			Kind string `json:"kind"`
		}
		_ = json.Unmarshal(raw, &kind)
		k := fsmmeter.Start
		switch kind.Kind {
		case "start":
		case "stop":
			k = fsmmeter.Stop
		default:
			results[i] = BatchResultDoc{Status: http.StatusBadRequest, Error: fmt.Sprintf(`field kind: %q, want "start" or "stop"`, kind.Kind)}
			continue
		}
		ev, code, err := decodeEventJSON(raw, k, true)
		if err != nil {
			results[i] = BatchResultDoc{Status: code, Error: err.Error()}
			s.metrics.events.WithLabelValues(kindLabel(k), itoa(code)).Inc()
			continue
		}
		evs = append(evs, ev)
		pos = append(pos, i)
	}
	// Every tenant the batch would write, as this handler parsed it, must
	// be the credential's (tenantscope); one that is not refuses the whole
	// batch before anything is written.
	for k, ev := range evs {
		if err := tenantscope.Check(r.Context(), fmt.Sprintf("events[%d].organization_id", pos[k]), ev.Target.Org); err != nil {
			writeError(w, http.StatusForbidden, status.Convert(err).Message())
			return
		}
	}
	for k, o := range s.SubmitBatch(forward.FromHTTP(r), evs) {
		code := httpCode(o.err)
		s.metrics.events.WithLabelValues(kindLabel(evs[k].Kind), itoa(code)).Inc()
		if o.err != nil {
			results[pos[k]] = BatchResultDoc{Status: code, Error: status.Convert(o.err).Message()}
			continue
		}
		d := BatchResultDoc{Status: http.StatusCreated, Result: "created", SpanID: o.resp.SpanId, Group: o.resp.Group}
		if o.resp.Duplicate {
			d.Result = "duplicate"
		}
		results[pos[k]] = d
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"results": results})
}
