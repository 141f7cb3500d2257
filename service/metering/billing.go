package metering

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/httpjson"
)

// Bill is GET /v1/usage/bill: the 95th percentile of a tenant's per-minute
// active series (summed over groups) in [from, to).
type Bill struct {
	Tenant  string `json:"tenant"`
	From    int64  `json:"from"`
	To      int64  `json:"to"`
	Minutes int    `json:"minutes_sampled"`
	P95     int64  `json:"p95_active_series"`
	Max     int64  `json:"max_active_series"`
}

// ComputeBill takes the nearest-rank 95th percentile (the value at rank
// ⌈0.95·n⌉ of the n sorted minutes) of per-minute totals, the convention of
// hosted Prometheus billing. It is the definition; bills are computed by
// stepBill, which gives the same numbers without one entry per minute.
func ComputeBill(perMinute map[int64]int64) (p95, maxV int64, n int) {
	vals := make([]int64, 0, len(perMinute))
	for _, v := range perMinute {
		vals = append(vals, v)
	}
	if len(vals) == 0 {
		return 0, 0, 0
	}
	slices.Sort(vals)
	return vals[p95Rank(len(vals))-1], vals[len(vals)-1], len(vals)
}

// p95Rank is the 1-based nearest rank of the 95th percentile of n values.
func p95Rank(n int) int { return int(math.Ceil(0.95 * float64(n))) }

// stepBill is ComputeBill over minutes [fromMin, toMin) of a tenant whose
// per-group samples (each group's sorted by minute) hold until the group's
// next sample: a minute's total is the sum over groups of each group's
// latest sample at or before it, and minutes before any group's first
// sample are not counted. The totals form a step function, so it works on
// its steps (one per change, weighted by their length in minutes) instead
// of a month's 44,640 minutes per tenant: the billing summary bills every
// tenant on each /api/v1/status.
func stepBill(groups [][]fsmmeter.Sample, fromMin, toMin int64) (p95, maxV int64, n int) {
	type change struct{ minute, delta int64 }
	var cs []change
	for _, ss := range groups {
		prev := int64(0)
		for _, x := range ss {
			if x.Minute >= toMin {
				break
			}
			// Samples before the window all take effect at its start: their
			// deltas add up to the count in force there.
			cs = append(cs, change{max(x.Minute, fromMin), x.Active - prev})
			prev = x.Active
		}
	}
	slices.SortFunc(cs, func(a, b change) int { return cmp.Compare(a.minute, b.minute) })
	type step struct{ v, minutes int64 }
	var steps []step
	total, covered := int64(0), int64(0)
	for i := 0; i < len(cs); {
		at := cs[i].minute
		for ; i < len(cs) && cs[i].minute == at; i++ {
			total += cs[i].delta
		}
		end := toMin
		if i < len(cs) {
			end = cs[i].minute
		}
		if end > at {
			steps = append(steps, step{total, end - at})
			covered += end - at
			maxV = max(maxV, total)
		}
	}
	if covered == 0 {
		return 0, 0, 0
	}
	slices.SortFunc(steps, func(a, b step) int { return cmp.Compare(a.v, b.v) })
	rank, seen := int64(p95Rank(int(covered))), int64(0)
	for _, st := range steps {
		if seen += st.minutes; seen >= rank {
			return st.v, maxV, int(covered)
		}
	}
	return steps[len(steps)-1].v, maxV, int(covered) // unreachable: seen ends at covered ≥ rank
}

// billMinutes turns a bill's [from, to) in Unix ms into minutes; minutes
// after the clock's current one are not counted.
func billMinutes(from, to, now int64) (fromMin, toMin int64) {
	return from / 60_000, min((to+59_999)/60_000, now/60_000+1)
}

// Bill computes a tenant's bill over [from, to) (Unix ms). Samplers write a
// group's count only when it changes, so each sample holds until the next:
// a minute's total is the sum over groups of each group's latest sample at
// or before it. Minutes before the first sample or after now are not counted.
func (s *Service) Bill(ctx context.Context, tenant string, from, to int64) (Bill, error) {
	fromMin, toMin := billMinutes(from, to, s.clock.Now())
	groups := make([][]fsmmeter.Sample, 0, s.host.Groups())
	for g := range s.host.Groups() {
		ss, err := s.seriesSamples(ctx, g, tenant, fromMin, toMin, true)
		if err != nil {
			return Bill{}, err
		}
		groups = append(groups, samplesFromProto(ss))
	}
	b := Bill{Tenant: tenant, From: from, To: to}
	b.P95, b.Max, b.Minutes = stepBill(groups, fromMin, toMin)
	return b, nil
}

func samplesFromProto(ss []*api.SeriesSample) []fsmmeter.Sample {
	out := make([]fsmmeter.Sample, len(ss))
	for i, x := range ss {
		out[i] = fsmmeter.Sample{Minute: x.Minute, Active: x.Active}
	}
	return out
}

func (s *Service) handleBill(w http.ResponseWriter, r *http.Request) {
	q, e := httpjson.Query(r)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	tenant := q.Get("tenant")
	// The tenant rule of every other endpoint (api.ValidateTenantID): a bill
	// for a name no tenant can have is a typo, not an empty bill.
	if err := api.ValidateTenantID(tenant); err != nil {
		httpjson.WriteErr(w, httpjson.Bad("tenant", "%v", err))
		return
	}
	from, err1 := parseTime(q.Get("from"))
	to, err2 := parseTime(q.Get("to"))
	if err1 != nil || err2 != nil || to <= from {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("query: from and to (Unix ms or RFC 3339) are required with from < to (%v %v)", err1, err2))
		return
	}
	b, err := s.Bill(forward.FromHTTP(r), tenant, from, to)
	if err != nil {
		writeError(w, readCode(err), status.Convert(err).Message())
		return
	}
	s.writeJSON(w, http.StatusOK, b)
}

const (
	// MaxBillingTenants bounds the tenants a BillingSummary lists (those
	// with the highest p95), so /api/v1/status stays small.
	MaxBillingTenants = 100
	// billingSummaryTimeout bounds the reads of groups this node holds no
	// replica of: a slow or unreachable leader costs the status page at
	// most this long, and shows up in the summary's errors.
	billingSummaryTimeout = 2 * time.Second
	// maxGroupSeriesMsg bounds one group's answer to GroupSeriesSamples (a
	// month of per-minute samples of many tenants is larger than gRPC's
	// default 4 MiB).
	maxGroupSeriesMsg = 64 << 20
)

// BillingSummary is the billing section of /api/v1/status: every tenant's
// month-to-date bill, the UTC calendar month of the metering clock's now.
// Each row is what GET /v1/usage/bill?tenant=…&from=From&to=To answers,
// except that groups this node holds a replica of are read from that
// replica (a follower may trail its leader by a moment) instead of the
// leader.
type BillingSummary struct {
	Month string `json:"month"` // "2026-11"
	From  int64  `json:"from"`  // the month's start, Unix ms
	To    int64  `json:"to"`    // the next month's start; minutes after now are not counted
	NowMs int64  `json:"now_ms"`
	// Tenants: the MaxBillingTenants tenants with the highest p95 (then
	// max, then name); Truncated says some were left out of TenantsTotal.
	Tenants      []Bill `json:"tenants"`
	TenantsTotal int    `json:"tenants_total"`
	Truncated    bool   `json:"truncated"`
	// Errors names the groups that could not be read (their leader did not
	// answer in time): the bills above leave those groups out.
	Errors []string `json:"errors,omitempty"`
}

// BillingSummary bills every tenant with active-series samples for the
// month to date. Groups held here are read from this node's replicas
// (cheap: no call per tenant or group); the others from their leaders, in
// parallel, one call per group, within billingSummaryTimeout (or ctx's
// deadline if sooner). It never fails: what could not be read is listed
// in Errors.
func (s *Service) BillingSummary(ctx context.Context) BillingSummary {
	now := s.clock.Now()
	month := time.UnixMilli(now).UTC()
	start := time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC)
	sum := BillingSummary{Month: start.Format("2006-01"), From: start.UnixMilli(), To: start.AddDate(0, 1, 0).UnixMilli(),
		NowMs: now, Tenants: []Bill{}}
	fromMin, toMin := billMinutes(sum.From, sum.To, now)

	ctx, cancel := context.WithTimeout(ctx, billingSummaryTimeout)
	defer cancel()
	// One reading of the group count: it can grow between two.
	n := s.host.Groups()
	perGroup := make([]map[string][]fsmmeter.Sample, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range perGroup {
		if s.host.Hosts(g) {
			perGroup[g] = s.host.Module(g).SeriesWindow(fromMin, toMin)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			perGroup[g], errs[g] = s.remoteGroupSeries(ctx, g, fromMin, toMin)
		}()
	}
	wg.Wait()

	tenants := map[string][][]fsmmeter.Sample{}
	for g, m := range perGroup {
		if errs[g] != nil {
			sum.Errors = append(sum.Errors, fmt.Sprintf("group %d: %s", g, status.Convert(errs[g]).Message()))
			continue
		}
		for t, ss := range m {
			tenants[t] = append(tenants[t], ss)
		}
	}
	for t, groups := range tenants {
		b := Bill{Tenant: t, From: sum.From, To: sum.To}
		b.P95, b.Max, b.Minutes = stepBill(groups, fromMin, toMin)
		sum.Tenants = append(sum.Tenants, b)
	}
	slices.SortFunc(sum.Tenants, func(a, b Bill) int {
		if c := cmp.Compare(b.P95, a.P95); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Max, a.Max); c != 0 {
			return c
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	sum.TenantsTotal = len(sum.Tenants)
	if len(sum.Tenants) > MaxBillingTenants {
		sum.Tenants, sum.Truncated = sum.Tenants[:MaxBillingTenants], true
	}
	return sum
}

// remoteGroupSeries reads group g's samples from its leader.
func (s *Service) remoteGroupSeries(ctx context.Context, g int, fromMin, toMin int64) (map[string][]fsmmeter.Sample, error) {
	c, rctx, err := s.remote(ctx, g)
	if err != nil {
		return nil, err
	}
	resp, err := c.GroupSeriesSamples(rctx, &api.GroupSeriesSamplesRequest{Group: uint32(g), FromMinute: fromMin, ToMinute: toMin},
		grpc.MaxCallRecvMsgSize(maxGroupSeriesMsg))
	if err != nil {
		return nil, err
	}
	out := make(map[string][]fsmmeter.Sample, len(resp.Tenants))
	for _, t := range resp.Tenants {
		out[t.Tenant] = samplesFromProto(t.Samples)
	}
	return out, nil
}

// groupSeries answers GroupSeriesSamples: from this node's replica when it
// leads the group or the call was forwarded here, else from the leader,
// falling back to this replica when the leader cannot be reached.
func (s *Service) groupSeries(ctx context.Context, g int, fromMin, toMin int64) ([]*api.TenantSeriesSamples, error) {
	if n := s.host.Groups(); g < 0 || g >= n {
		return nil, status.Errorf(codes.InvalidArgument, "group %d: the cluster has %d groups", g, n)
	}
	var m map[string][]fsmmeter.Sample
	var err error
	if s.readLocal(ctx, g) {
		m = s.host.Module(g).SeriesWindow(fromMin, toMin)
	} else if m, err = s.remoteGroupSeries(ctx, g, fromMin, toMin); err != nil {
		if !s.host.Hosts(g) {
			return nil, err
		}
		m = s.host.Module(g).SeriesWindow(fromMin, toMin) // leader unreachable: this replica, possibly behind
	}
	out := make([]*api.TenantSeriesSamples, 0, len(m))
	for t, ss := range m {
		ts := &api.TenantSeriesSamples{Tenant: t, Samples: make([]*api.SeriesSample, len(ss))}
		for i, x := range ss {
			ts.Samples[i] = &api.SeriesSample{Minute: x.Minute, Active: x.Active}
		}
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b *api.TenantSeriesSamples) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return out, nil
}
