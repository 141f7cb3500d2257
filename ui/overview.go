package ui

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-io/tollgate/httpjson"
)

// Overview is /api/v1/overview: everything the web dashboard (package ui) shows
// on its overview and tenants pages, in one response so a page renders one
// consistent moment instead of stitching several polls together.
type Overview struct {
	Node              string          `json:"node"`
	Zone              string          `json:"zone"`
	Ready             bool            `json:"ready"`
	NotReadyReason    string          `json:"not_ready_reason,omitempty"`
	Time              time.Time       `json:"time"`
	Partitions        int             `json:"partitions"`
	NearLimitFraction float64         `json:"near_limit_fraction"`
	Zones             []ZoneOverview  `json:"zones"`
	Groups            []GroupOverview `json:"groups"`
	Rates             RateOverview    `json:"rates"`
	// Tenants is one page of the tenants, most used first (limit, default
	// 500, and page_token); TenantsTotal counts them all and NextPageToken
	// (empty on the last page) asks for the next page of the same ranking.
	Tenants       []TenantOverview `json:"tenants"`
	TenantsTotal  int              `json:"tenants_total"`
	NextPageToken string           `json:"next_page_token,omitempty"`
}

// ZoneOverview lists the members of one zone.
type ZoneOverview struct {
	Zone    string           `json:"zone"`
	Members []MemberOverview `json:"members"`
}

// MemberOverview is one member's health as this node sees it. Health is the
// serf status, except that an alive member whose gRPC API did not answer the
// status fan-out is "unreachable": gossip alone would call it fine.
type MemberOverview struct {
	ID        string `json:"id"`
	Zone      string `json:"zone"`
	GRPC      string `json:"grpc"`
	Status    string `json:"status"` // serf: alive, leaving, left, failed
	Health    string `json:"health"` // alive, unreachable, leaving, left, failed
	Self      bool   `json:"self"`
	GroupsLed []int  `json:"groups_led"`
	// ClockOffsetNs is the member's clock minus the cluster's median clock
	// as this node measures it (absent: not measured); ClockOutOfBound: it
	// is beyond the maximum clock offset and may not lead (package clockbound).
	ClockOffsetNs   *int64 `json:"clock_offset_ns,omitempty"`
	ClockOutOfBound bool   `json:"clock_out_of_bound,omitempty"`
}

// GroupOverview is one raft group: its leader and each voter's raft progress.
type GroupOverview struct {
	Group      int             `json:"group"`
	Partitions [2]int          `json:"partitions"` // [lo, hi)
	Leader     string          `json:"leader"`
	Series     int64           `json:"series"` // as the leader's replica holds them (this node's replica if the leader did not answer)
	Tenants    int             `json:"tenants"`
	Voters     []VoterOverview `json:"voters"`
}

// VoterOverview is one voter's replica of a group. Known is false when the
// voter did not answer (failed or unreachable): its indexes are then unknown,
// not zero.
type VoterOverview struct {
	ID           string `json:"id"`
	Known        bool   `json:"known"`
	State        string `json:"state,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	CommitIndex  uint64 `json:"commit_index"`
	LastIndex    uint64 `json:"last_index"`
}

// RateOverview holds per-second rates over the last WindowSeconds. Requests
// and series decisions are this node's counters (requests it answered; series
// decided in the groups it leads): a node only counts its own work, so the page
// names the node. Active series and raft entries are cluster-wide, from each
// group's leader and voters.
type RateOverview struct {
	WindowSeconds      float64 `json:"window_seconds"` // 0 until two samples exist
	Requests           float64 `json:"requests_per_second"`
	RequestErrors      float64 `json:"request_errors_per_second"`
	SeriesCreated      float64 `json:"series_created_per_second"`
	SeriesRefreshed    float64 `json:"series_refreshed_per_second"`
	SeriesRejected     float64 `json:"series_rejected_per_second"`
	RaftEntries        float64 `json:"raft_entries_per_second"` // cluster-wide: log entries applied, all groups
	ActiveSeries       int64   `json:"active_series"`
	ActiveSeriesChange float64 `json:"active_series_change_per_second"`
}

// TenantOverview is one tenant's usage against its limit on this node's
// replicas. Near is true when the whole tenant, or its share in any one group,
// reached the server's near-limit fraction (the same rule as
// GetUsersCloseToLimit), since a tenant is refused per group share.
type TenantOverview struct {
	Tenant     string  `json:"tenant"`
	Active     int64   `json:"active"`
	Limit      int64   `json:"limit"` // max_series; 0 = unlimited
	Fraction   float64 `json:"fraction"`
	Near       bool    `json:"near_limit"`
	NearGroups []int   `json:"near_groups,omitempty"`
}

// overviewWindow is how far back rates look: long enough to smooth a 1 s poll,
// short enough that the page follows a load change within seconds.
const overviewWindow = 10 * time.Second

// overviewCacheTTL bounds the work many open dashboards cause: the status
// fan-out to every member runs at most once per TTL whatever the poll rate.
const overviewCacheTTL = 800 * time.Millisecond

type rateSample struct {
	at                           time.Time
	requests, errors             float64
	created, refreshed, rejected float64
	active                       int64
	applied                      uint64 // sum over groups of the highest applied index known
}

// OverviewConfig is what the overview needs of its node.
type OverviewConfig struct {
	// Build reads the node's overview, all but the rates, with the active
	// series and the sum over groups of the highest applied index known
	// (the rates' inputs).
	Build func(ctx context.Context) (ov Overview, active int64, applied uint64)
	// Page parses the request's limit and page_token (the node's paging
	// rules, default limit def).
	Page func(r *http.Request, def int) (limit int, token string, e *httpjson.Error)
	// DefaultTop is the default page size of the tenant list.
	DefaultTop int
	// Gatherer holds the node's request and series counters (the rates).
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
}

// overviewHandler serves /api/v1/overview. It keeps its rate samples itself
// (taken when it is asked, so an idle node does no work for the dashboard).
type overviewHandler struct {
	cfg OverviewConfig

	mu      sync.Mutex
	samples []rateSample
	cached  *Overview
	builtAt time.Time
}

// OverviewHandler serves /api/v1/overview.
func OverviewHandler(cfg OverviewConfig) http.Handler { return &overviewHandler{cfg: cfg} }

func (h *overviewHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit, token, e := h.cfg.Page(r, h.cfg.DefaultTop)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 {
			httpjson.WriteErr(w, httpjson.Bad("page_token", "not a token this endpoint returned (next_page_token)"))
			return
		}
		start = n
	}
	h.mu.Lock()
	if h.cached == nil || time.Since(h.builtAt) >= overviewCacheTTL {
		ov, active, applied := h.cfg.Build(r.Context())
		ov.Rates = h.rates(active, applied)
		h.cached, h.builtAt = &ov, time.Now()
	}
	ov := *h.cached // the cached value is never changed, only replaced
	h.mu.Unlock()
	// Only the page is encoded: with many tenants the whole list is
	// megabytes, and a dashboard shows the top of it.
	all := ov.Tenants
	start = min(start, len(all))
	end := min(start+limit, len(all))
	ov.Tenants, ov.TenantsTotal = all[start:end], len(all)
	if end < len(all) {
		ov.NextPageToken = strconv.Itoa(end)
	}
	w.Header().Set("Cache-Control", "no-store")
	httpjson.Write(w, h.cfg.Logger, http.StatusOK, ov)
}

// rates records a sample of this node's counters and returns per-second rates
// against the oldest sample still inside the window. Called with h.mu held.
func (h *overviewHandler) rates(active int64, applied uint64) RateOverview {
	now := time.Now()
	cur := rateSample{at: now, active: active, applied: applied}
	if mfs, err := h.cfg.Gatherer.Gather(); err == nil {
		for _, mf := range mfs {
			switch mf.GetName() {
			case "tollgate_grpc_requests_total":
				for _, m := range mf.GetMetric() {
					v := m.GetCounter().GetValue()
					cur.requests += v
					if labelValue(m, "code") != "OK" {
						cur.errors += v
					}
				}
			case "tollgate_series_created_total":
				cur.created = sumCounter(mf)
			case "tollgate_series_refreshed_logged_total":
				cur.refreshed = sumCounter(mf)
			case "tollgate_series_rejected_total":
				cur.rejected = sumCounter(mf)
			}
		}
	}
	keep := h.samples[:0]
	for _, p := range h.samples {
		if now.Sub(p.at) <= overviewWindow {
			keep = append(keep, p)
		}
	}
	h.samples = append(keep, cur)
	out := RateOverview{ActiveSeries: active}
	first := h.samples[0]
	dt := now.Sub(first.at).Seconds()
	if dt < 0.5 {
		return out // one sample (or two too close together): no honest rate yet
	}
	out.WindowSeconds = dt
	per := func(a, b float64) float64 { return max(0, b-a) / dt }
	out.Requests = per(first.requests, cur.requests)
	out.RequestErrors = per(first.errors, cur.errors)
	out.SeriesCreated = per(first.created, cur.created)
	out.SeriesRefreshed = per(first.refreshed, cur.refreshed)
	out.SeriesRejected = per(first.rejected, cur.rejected)
	out.ActiveSeriesChange = float64(cur.active-first.active) / dt
	if cur.applied > first.applied {
		out.RaftEntries = float64(cur.applied-first.applied) / dt
	}
	return out
}

func sumCounter(mf *dto.MetricFamily) float64 {
	var t float64
	for _, m := range mf.GetMetric() {
		t += m.GetCounter().GetValue()
	}
	return t
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
