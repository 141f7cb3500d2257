package metering

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/httpjson"
)

// defaultQueryLimit bounds a ledger query's answer.
const defaultQueryLimit = 10_000

// GroupStatus is one group's sampler progress as this node sees it.
type GroupStatus struct {
	Group     int  `json:"group"`
	Leader    bool `json:"leader"` // this node runs the group's sampler
	SpansOpen int  `json:"spans_open"`
	Spans     int  `json:"spans"`
	Pending   int  `json:"spans_pending"` // spans with an interval due now
	Planned   int  `json:"intervals_planned"`
	// OldestUnsampled is the oldest boundary with work due (Unix ms; 0 when
	// caught up); LagMs is now minus it.
	OldestUnsampled int64 `json:"oldest_unsampled_ms"`
	LagMs           int64 `json:"lag_ms"`
	Records         int   `json:"ledger_records"`
	DeadLetters     int   `json:"dead_letters"`
	// SeriesTenants: tenants with active-series samples (billing) in the
	// group; SeriesBytes: the memory those samples hold on this replica,
	// the open month at full resolution, closed months compacted.
	SeriesTenants int `json:"series_tenants"`
	SeriesBytes   int `json:"series_bytes"`
}

// Status is GET /v1/metering/status.
type Status struct {
	Node        string        `json:"node"`
	NowMs       int64         `json:"now_ms"`
	Granularity string        `json:"granularity"`
	Location    string        `json:"location"`
	TestClock   bool          `json:"test_clock"`
	Groups      []GroupStatus `json:"groups"`
}

// Status reports every group this node holds a replica of.
func (s *Service) Status() Status {
	now := s.clock.Now()
	st := Status{Node: s.host.NodeID(), NowMs: now, Granularity: s.grid.G.String(), Location: s.cfg.Location.String(), TestClock: s.cfg.TestClock}
	for g := range s.host.Groups() {
		if !s.host.Hosts(g) {
			continue
		}
		ms := s.host.Module(g).Stats(s.grid, now)
		gs := GroupStatus{Group: g, Leader: s.host.Leads(g), SpansOpen: ms.SpansOpen, Spans: ms.Spans, Pending: ms.Pending,
			Planned: ms.Planned, OldestUnsampled: ms.OldestDue, Records: ms.Records, DeadLetters: ms.DeadLetters,
			SeriesTenants: ms.SeriesTenants, SeriesBytes: ms.SeriesBytes}
		if ms.OldestDue != 0 {
			gs.LagMs = max(0, now-ms.OldestDue)
		}
		st.Groups = append(st.Groups, gs)
	}
	return st
}

func (s *Service) handleStatus(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Status())
}

// remote returns a Metering client for group g's leader, for reads of groups
// this node holds no replica of.
func (s *Service) remote(ctx context.Context, g int) (api.MeteringClient, context.Context, error) {
	cc, fctx, err := s.host.LeaderConn(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	return api.NewMeteringClient(cc), fctx, nil
}

// readLocal says whether a read of group g is answered from this node's
// replica: on the leader (it has applied everything it acknowledged), or
// when another node already forwarded the read here. Other reads go to the
// leader, so a client reads what it was told was written.
func (s *Service) readLocal(ctx context.Context, g int) bool {
	return s.host.Leads(g) || (forward.Was(ctx) && s.host.Hosts(g))
}

// queryUsage reads ledger records of group g (-1: every group) from local
// replicas, or from the leader for groups not held here.
func (s *Service) queryUsage(ctx context.Context, g int, f fsmmeter.Filter) ([]*api.UsageRecord, error) {
	if f.Limit <= 0 || f.Limit > defaultQueryLimit {
		f.Limit = defaultQueryLimit
	}
	groups := []int{g}
	if g < 0 {
		groups = groups[:0]
		for i := range s.host.Groups() {
			groups = append(groups, i)
		}
	} else if n := s.host.Groups(); g >= n {
		return nil, status.Errorf(codes.InvalidArgument, "group %d: the cluster has %d groups", g, n)
	}
	var out []*api.UsageRecord
	for _, gi := range groups {
		if s.readLocal(ctx, gi) {
			for _, r := range s.host.Module(gi).Query(f) {
				out = append(out, recordToProto(gi, r))
			}
			continue
		}
		c, rctx, err := s.remote(ctx, gi)
		if err == nil {
			var resp *api.QueryUsageResponse
			resp, err = c.QueryUsage(rctx, &api.QueryUsageRequest{Group: int32(gi), Target: targetToProto(f.Target), From: f.From, To: f.To, Limit: uint32(f.Limit)})
			if err == nil {
				out = append(out, resp.Records...)
				continue
			}
		}
		if !s.host.Hosts(gi) {
			return nil, err
		}
		for _, r := range s.host.Module(gi).Query(f) { // leader unreachable: this replica, possibly behind
			out = append(out, recordToProto(gi, r))
		}
	}
	slices.SortFunc(out, func(a, b *api.UsageRecord) int {
		if a.Timestamp != b.Timestamp {
			return cmpInt(a.Timestamp, b.Timestamp)
		}
		return cmpStr(a.UsageId, b.UsageId)
	})
	if len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

func cmpInt(a, b int64) int {
	if a < b {
		return -1
	}
	if a > b {
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	if a < b {
		return -1
	}
	if a > b {
		return 1
	}
	return 0
}

func recordToProto(g int, r fsmmeter.Record) *api.UsageRecord {
	p := &api.UsageRecord{UsageId: r.UsageID, Target: targetToProto(r.Target), Timestamp: r.Timestamp, Start: r.Start, End: r.End, Backward: r.Backward, Group: uint32(g)}
	for _, m := range r.Measures {
		p.MeasuredUsage = append(p.MeasuredUsage, &api.MeterMeasure{Measure: m.Name, Quantity: m.Quantity})
	}
	return p
}

func recordFromProto(p *api.UsageRecord) RecordDoc {
	t := targetFromProto(p.Target)
	d := RecordDoc{UsageID: p.UsageId, Group: int(p.Group), Timestamp: p.Timestamp, Start: p.Start, End: p.End, Backward: p.Backward,
		OrganizationID: t.Org, SpaceID: t.Space, ConsumerID: t.Consumer, ResourceID: t.Resource, PlanID: t.Plan, ResourceInstanceID: t.Instance}
	for _, m := range p.MeasuredUsage {
		d.MeasuredUsage = append(d.MeasuredUsage, MeasureOut{m.Measure, m.Quantity})
	}
	return d
}

// parseTime reads Unix ms or RFC 3339.
func parseTime(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, fmt.Errorf("%q is neither Unix milliseconds nor RFC 3339", v)
	}
	return t.UnixMilli(), nil
}

func (s *Service) handleQuery(w http.ResponseWriter, r *http.Request) {
	q, e := httpjson.Query(r)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	from, err := parseTime(q.Get("from"))
	if err != nil {
		httpjson.WriteErr(w, httpjson.Bad("from", "%v", err))
		return
	}
	to, err := parseTime(q.Get("to"))
	if err != nil {
		httpjson.WriteErr(w, httpjson.Bad("to", "%v", err))
		return
	}
	if from < 0 || to < 0 {
		httpjson.WriteErr(w, httpjson.Bad("from", "times before 1970 (from %d, to %d) hold no usage", from, to))
		return
	}
	if q.Get("to") != "" && to < from {
		httpjson.WriteErr(w, httpjson.Bad("to", "%d is before from (%d)", to, from))
		return
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil:
			httpjson.WriteErr(w, httpjson.Bad("limit", "%q is not an integer", v))
			return
		case n < 0:
			httpjson.WriteErr(w, httpjson.Bad("limit", "%d is negative; give 1 to %d, or leave it out for %d", n, defaultQueryLimit, defaultQueryLimit))
			return
		}
		limit = n
	}
	f := fsmmeter.Filter{Target: fsmmeter.Target{Org: q.Get("organization_id"), Space: q.Get("space_id"), Consumer: q.Get("consumer_id"),
		Resource: q.Get("resource_id"), Plan: q.Get("plan_id"), Instance: q.Get("resource_instance_id")}, From: from, To: to, Limit: limit}
	recs, err := s.queryUsage(forward.FromHTTP(r), -1, f)
	if err != nil {
		writeError(w, readCode(err), status.Convert(err).Message())
		return
	}
	out := struct {
		Records []RecordDoc `json:"records"`
	}{Records: []RecordDoc{}}
	for _, p := range recs {
		out.Records = append(out.Records, recordFromProto(p))
	}
	s.writeJSON(w, http.StatusOK, out)
}

// seriesSamples reads a tenant's samples of group g with minute in [from,
// to), led by the count in force at from when withPrior is set, from the
// group's leader (or this replica; see readLocal).
func (s *Service) seriesSamples(ctx context.Context, g int, tenant string, from, to int64, withPrior bool) ([]*api.SeriesSample, error) {
	if n := s.host.Groups(); g < 0 || g >= n {
		return nil, status.Errorf(codes.InvalidArgument, "group %d: the cluster has %d groups", g, n)
	}
	local := func() []*api.SeriesSample {
		var out []*api.SeriesSample
		for _, x := range s.host.Module(g).SeriesSamples(tenant, from, to, withPrior) {
			out = append(out, &api.SeriesSample{Minute: x.Minute, Active: x.Active})
		}
		return out
	}
	if s.readLocal(ctx, g) {
		return local(), nil
	}
	c, rctx, err := s.remote(ctx, g)
	if err == nil {
		req := &api.SeriesSamplesRequest{Group: uint32(g), Tenant: tenant, FromMinute: from, ToMinute: to, WithPrior: withPrior}
		var resp *api.SeriesSamplesResponse
		if resp, err = c.SeriesSamples(rctx, req); err == nil && withPrior && !resp.PriorIncluded {
			// A leader on an older build ignored with_prior: everything
			// before to, as those builds billed.
			req.FromMinute, req.WithPrior = 0, false
			resp, err = c.SeriesSamples(rctx, req)
		}
		if err == nil {
			return resp.Samples, nil
		}
	}
	if s.host.Hosts(g) {
		return local(), nil // leader unreachable: this replica, possibly behind
	}
	return nil, err
}

func (s *Service) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	type dl struct {
		Record RecordDoc `json:"record"`
		Code   int       `json:"code"`
		Reason string    `json:"reason"`
		At     int64     `json:"at"`
	}
	out := struct {
		DeadLetters []dl `json:"dead_letters"`
	}{DeadLetters: []dl{}}
	for g := range s.host.Groups() {
		if !s.host.Hosts(g) {
			continue
		}
		for _, d := range s.host.Module(g).DeadLetters() {
			out.DeadLetters = append(out.DeadLetters, dl{recordDoc(g, d.Record), d.Code, d.Reason, d.At})
		}
	}
	s.writeJSON(w, http.StatusOK, out)
}

// ClockRequest is POST /v1/metering/clock (test clock only).
type ClockRequest struct {
	SetMs     *int64 `json:"set_ms,omitempty"`
	AdvanceMs int64  `json:"advance_ms,omitempty"`
}

// ClockResponse answers POST /v1/metering/clock.
type ClockResponse struct {
	NowMs     int64 `json:"now_ms"`
	TestClock bool  `json:"test_clock"`
}

// maxAdvanceMs keeps an advance within time.Duration (about 292 years).
const maxAdvanceMs = math.MaxInt64 / int64(time.Millisecond)

// SetClock is POST /v1/metering/clock and the SetClock RPC: it fixes the
// clock at *set when set is non-nil, then advances it by advanceMs, and
// answers the clock's now. A request changing nothing only reads it (on
// any node). It fails with ErrClockLocked on a node not started with the
// test clock, with ErrClockBackwards for a negative advance.
func (s *Service) SetClock(set *int64, advanceMs int64) (ClockResponse, error) {
	if advanceMs < 0 {
		return ClockResponse{}, ErrClockBackwards
	}
	if advanceMs > maxAdvanceMs {
		return ClockResponse{}, fmt.Errorf("metering clock: advance %d ms is over the bound %d ms", advanceMs, maxAdvanceMs)
	}
	advance := time.Duration(advanceMs) * time.Millisecond
	if set != nil {
		if err := s.clock.Set(*set); err != nil {
			return ClockResponse{}, err
		}
	}
	if advance != 0 {
		if err := s.clock.Advance(advance); err != nil {
			return ClockResponse{}, err
		}
	}
	return ClockResponse{NowMs: s.clock.Now(), TestClock: s.cfg.TestClock}, nil
}

// handleClock: a node without the test clock answers 409 Conflict (its
// state, not the caller's credentials, refuses: the admin rule's 401/403
// mean the latter), a negative advance 400.
func (s *Service) handleClock(w http.ResponseWriter, r *http.Request) {
	var req ClockRequest
	body, e := httpjson.ReadBody(w, r, 4096)
	if e == nil {
		e = httpjson.DecodeObject(body, &req)
	}
	if e != nil {
		e.Msg = "clock: " + e.Msg
		httpjson.WriteErr(w, e)
		return
	}
	resp, err := s.SetClock(req.SetMs, req.AdvanceMs)
	switch {
	case errors.Is(err, ErrClockLocked):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		s.writeJSON(w, http.StatusOK, resp)
	}
}
