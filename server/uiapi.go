package server

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/membership"
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
	// is beyond the maximum clock offset and may not lead (clock.go).
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

// overviewHandler serves /api/v1/overview. It keeps its rate samples itself
// (taken when it is asked, so an idle node does no work for the dashboard).
type overviewHandler struct {
	s *Server

	mu      sync.Mutex
	samples []rateSample
	cached  *Overview
	builtAt time.Time
}

func (s *Server) overviewHandler() http.Handler { return &overviewHandler{s: s} }

func (h *overviewHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit, token, e := pageParams(r, defaultOverviewTop)
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
		ov := h.build(r.Context())
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
	httpjson.Write(w, h.s.log, http.StatusOK, ov)
}

func (h *overviewHandler) build(ctx context.Context) Overview {
	s := h.s
	ov := Overview{
		Node: s.cfg.NodeID, Zone: s.cfg.Zone, NotReadyReason: s.NotReadyReason(),
		Time: time.Now().UTC(), Partitions: s.cfg.Partitions, NearLimitFraction: s.cfg.NearLimitFraction,
	}
	ov.Ready = ov.NotReadyReason == ""

	// Every alive member's per-group raft state, through the admin Status
	// fan-out, as the node's own work: the peers see this node's node
	// credential (nodeauth.go), not the page's caller.
	sctx, cancel := context.WithTimeout(forward.Own(ctx), 3*time.Second)
	defer cancel()
	nodes := map[string]map[int]*api.GroupState{}
	if resp, err := s.admin.Status(sctx, &api.StatusRequest{}); err == nil {
		for _, n := range resp.Nodes {
			gs := map[int]*api.GroupState{}
			for _, g := range n.Groups {
				gs[int(g.Group)] = g
			}
			nodes[n.NodeId] = gs
		}
	}

	view, _ := s.view.get()
	zones := map[string]*ZoneOverview{}
	health := map[string]string{}
	if view != nil {
		for _, m := range view.Members {
			mo := MemberOverview{ID: m.Id, Zone: m.Zone, GRPC: m.GrpcAddress, Status: m.Status, Health: m.Status, Self: m.Id == s.cfg.NodeID}
			if m.Status == membership.StatusAlive && nodes[m.Id] == nil {
				mo.Health = "unreachable"
			}
			for _, g := range m.GroupsLed {
				mo.GroupsLed = append(mo.GroupsLed, int(g))
			}
			if off, ok := s.clock.offsetFromMedian(m.Id); ok {
				ns := int64(off)
				mo.ClockOffsetNs, mo.ClockOutOfBound = &ns, off > s.cfg.MaxClockOffset || off < -s.cfg.MaxClockOffset
			}
			health[m.Id] = mo.Health
			z := zones[m.Zone]
			if z == nil {
				z = &ZoneOverview{Zone: m.Zone}
				zones[m.Zone] = z
			}
			z.Members = append(z.Members, mo)
		}
	}
	for _, z := range zones {
		slices.SortFunc(z.Members, func(a, b MemberOverview) int { return strings.Compare(a.ID, b.ID) })
		ov.Zones = append(ov.Zones, *z)
	}
	slices.SortFunc(ov.Zones, func(a, b ZoneOverview) int { return strings.Compare(a.Zone, b.Zone) })

	var active int64
	var applied uint64
	for g := range s.cfg.Groups {
		lo, hi := s.fsms[g].PartitionRange()
		st := s.fsms[g].Stats()
		gov := GroupOverview{Group: g, Partitions: [2]int{lo, hi}, Series: st.Series, Tenants: st.Tenants}
		if view != nil && g < len(view.GroupInfo) {
			gi := view.GroupInfo[g]
			gov.Leader = gi.LeaderId
			for _, id := range gi.Voters {
				vo := VoterOverview{ID: id}
				if gs := nodes[id][g]; gs != nil && health[id] != membership.StatusFailed {
					vo.Known, vo.State = true, gs.RaftState
					vo.AppliedIndex, vo.CommitIndex, vo.LastIndex = gs.AppliedIndex, gs.CommitIndex, gs.LastIndex
				}
				gov.Voters = append(gov.Voters, vo)
			}
		}
		if gs := nodes[gov.Leader][g]; gs != nil {
			gov.Series, gov.Tenants = int64(gs.Series), int(gs.Tenants)
		}
		active += gov.Series
		top := s.fsms[g].AppliedIndex()
		for _, v := range gov.Voters {
			top = max(top, v.AppliedIndex)
		}
		applied += top
		ov.Groups = append(ov.Groups, gov)
	}

	ov.Tenants = s.tenantOverview()
	ov.Rates = h.rates(active, applied)
	return ov
}

// tenantOverview sums each tenant's active series over this node's replicas,
// most used first.
func (s *Server) tenantOverview() []TenantOverview {
	limits := s.currentLimits()
	byName := map[string]*TenantOverview{}
	for g, f := range s.fsms {
		share := s.groupShares(g)
		for _, t := range f.Tenants() {
			a := t.Active()
			to := byName[t.Name]
			if to == nil {
				to = &TenantOverview{Tenant: t.Name, Limit: limits.For(t.Name).MaxSeries}
				byName[t.Name] = to
			}
			to.Active += a
			if s.nearShare(a, share(t.Name)) {
				to.NearGroups = append(to.NearGroups, g)
			}
		}
	}
	out := make([]TenantOverview, 0, len(byName))
	for _, to := range byName {
		if to.Active == 0 && len(to.NearGroups) == 0 {
			continue // registered once, every series expired: not worth a row
		}
		if to.Limit > 0 {
			to.Fraction = float64(to.Active) / float64(to.Limit)
		}
		to.Near = len(to.NearGroups) > 0 || (to.Limit > 0 && to.Fraction >= s.cfg.NearLimitFraction)
		out = append(out, *to)
	}
	slices.SortFunc(out, func(a, b TenantOverview) int {
		if a.Fraction != b.Fraction {
			if a.Fraction > b.Fraction {
				return -1
			}
			return 1
		}
		if a.Active != b.Active {
			if a.Active > b.Active {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Tenant, b.Tenant)
	})
	return out
}

// rates records a sample of this node's counters and returns per-second rates
// against the oldest sample still inside the window. Called with h.mu held.
func (h *overviewHandler) rates(active int64, applied uint64) RateOverview {
	now := time.Now()
	cur := rateSample{at: now, active: active, applied: applied}
	if mfs, err := h.s.metrics.reg.Gather(); err == nil {
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
