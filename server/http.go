package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clockbound"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/service/metering"
	"github.com/tollgate-io/tollgate/ui"
	"github.com/tollgate-io/tollgate/version"
)

func (s *Server) startHTTP() error {
	if s.cfg.Node.HTTPAddr == "-" {
		return nil
	}
	lis, err := net.Listen("tcp", s.cfg.Node.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", s.cfg.Node.HTTPAddr, err)
	}
	s.httpLis = lis
	mux := &routeMux{ServeMux: http.NewServeMux(), guard: s.guardRoute}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if why := s.NotReadyReason(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		if why := s.clock.OutOfBound(); why != "" {
			// Still ready: it serves as a follower and forwards writes.
			fmt.Fprintln(w, "ready (follower only): "+why)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /api/v1/status", s.handleStatus)
	mux.HandleFunc("GET /api/v1/tenants", s.handleTenants)
	mux.HandleFunc("GET /api/v1/tenants/{tenant}", s.handleTenant)
	mux.HandleFunc("GET /{$}", s.handleIndex)
	mux.Handle("GET /api/v1/overview", s.overviewHandler())
	mux.Handle("GET /ui/", ui.Handler())
	for _, c := range s.comps { // components.go
		if c.http != nil {
			c.http(mux)
		}
	}
	if s.cfg.Access.EnableDebugEndpoints {
		mux.Handle("/debug/pprof/", s.requireAdmin(http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/cmdline", s.requireAdmin(http.HandlerFunc(pprof.Cmdline)))
		mux.Handle("/debug/pprof/profile", s.requireAdmin(http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/symbol", s.requireAdmin(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("/debug/pprof/trace", s.requireAdmin(http.HandlerFunc(pprof.Trace)))
	}
	b := s.cfg.Bounds
	s.httpCap = access.NewConnCap(lis, b.HTTPMaxConns)
	if s.cfg.Access.TLS.HTTP == nil {
		// Liveness checks still get an answer when a flood leaves the cap
		// nothing to displace (its answer is the handler's below).
		s.httpCap.AnswerHealthBeyondCap()
	}
	s.httpRoutes = slices.Clone(mux.patterns)
	s.http = &http.Server{Handler: mux.ServeMux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: b.HTTPReadTimeout,
		WriteTimeout: b.HTTPWriteTimeout, IdleTimeout: b.HTTPIdleTimeout, MaxHeaderBytes: b.HTTPMaxHeaderBytes,
		ConnState: s.httpCap.ConnState, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	s.metrics.reg.MustRegister(s.httpCap.Collectors()...)
	go func() {
		if err := s.serveHTTP(s.httpCap); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// routeMux records every pattern mounted on the HTTP mux, so HTTPRoutes can
// list them: the API contract test fails on a route api/openapi.yaml lacks,
// and the access-rule test on one without a rule.
type routeMux struct {
	*http.ServeMux
	patterns []string
	guard    func(pattern string, h http.Handler) http.Handler // the access rule of each route
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, m.guard(pattern, h))
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// HTTPRoutes returns the patterns served on the HTTP address ("GET /readyz",
// "/api/v1/backlog" for every method), in the order they were mounted; nil when
// HTTP is off.
func (s *Server) HTTPRoutes() []string { return slices.Clone(s.httpRoutes) }

// GroupStatus is one group's row in /api/v1/status.
type GroupStatus struct {
	Group        int    `json:"group"`
	Partitions   [2]int `json:"partitions"`
	State        string `json:"state"`
	Leader       string `json:"leader"`
	AppliedIndex uint64 `json:"applied_index"`
	Series       int64  `json:"series"`
	Tenants      int    `json:"tenants"`
	NearLimit    int    `json:"tenants_near_limit"`
	// Halted is why this replica stopped applying (an entry it cannot
	// apply: see docs/upgrading.md); empty while it applies.
	Halted string `json:"halted,omitempty"`
}

// NodeStatus is /api/v1/status.
type NodeStatus struct {
	Node   string        `json:"node"`
	Zone   string        `json:"zone"`
	GRPC   string        `json:"grpc"`
	Raft   string        `json:"raft"`
	Ready  bool          `json:"ready"`
	Groups []GroupStatus `json:"groups"`
	// SamplingController is the backlog controller (sampling.go).
	SamplingController *SamplingControllerState `json:"sampling_controller,omitempty"`
	// Sketches: the sketch hub's counters and the statusTopPartitions largest
	// per-(tenant, partition) estimates (more at /api/v1/sketches?top=N).
	Sketches *SketchStatus `json:"sketches,omitempty"`
	// Billing is every tenant's month-to-date active-series bill (p95 as
	// `tollgate usage bill` computes it), at most 100 tenants; groups whose
	// leader does not answer within 2s are listed in its errors.
	Billing *metering.BillingSummary `json:"billing,omitempty"`
	// Clock: the maximum clock offset, this node's offset to the cluster's
	// median clock and to each peer, and whether it may lead (clockbound).
	Clock *clockbound.Status `json:"clock,omitempty"`
}

// statusTopPartitions bounds the per-partition estimates in /api/v1/status.
const statusTopPartitions = 10

// Status returns this node's view of its groups.
func (s *Server) Status() NodeStatus {
	st := NodeStatus{Node: s.cfg.Node.ID, Zone: s.cfg.Node.Zone, GRPC: s.GRPCAddr(), Raft: s.RaftAddr(), Ready: s.Ready(), Clock: s.clock.Status()}
	for g, f := range s.servedFSMs() {
		r := s.host.Raft(g)
		_, leader := r.LeaderWithID()
		fs := f.Stats()
		lo, hi := f.PartitionRange()
		_, why := f.Halted()
		st.Groups = append(st.Groups, GroupStatus{
			Group: g, Partitions: [2]int{lo, hi}, State: r.State().String(), Leader: string(leader),
			AppliedIndex: fs.AppliedIndex, Series: fs.Series, Tenants: fs.Tenants, NearLimit: len(s.closeToLimit(g)),
			Halted: why,
		})
	}
	return st
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st := s.Status()
	if s.sampling != nil {
		sc := s.sampling.State()
		st.SamplingController = &sc
	}
	if s.sketches != nil {
		st.Sketches = &SketchStatus{Node: s.cfg.Node.ID, Stats: s.sketches.Stats(), Top: s.sketches.Top(statusTopPartitions)}
	}
	if s.meter != nil {
		b := s.meter.BillingSummary(r.Context())
		st.Billing = &b
	}
	s.writeJSON(w, st)
}

// TenantUsage is /api/v1/tenants/{tenant}: the tenant's active series per group as
// this replica sees them, with the group shares of its current max_series.
type TenantUsage struct {
	Tenant    string  `json:"tenant"`
	MaxSeries int64   `json:"max_series"`
	Series    int64   `json:"series"`
	PerGroup  []int64 `json:"series_per_group"`
	Shares    []int64 `json:"share_per_group"`
	// ShareMoves: per group, base, delta, given/received headroom and the
	// transfers outstanding (movable shares, shares.go).
	ShareMoves []TenantShares `json:"share_moves,omitempty"`
}

// Usage returns a tenant's usage on this node's replicas.
func (s *Server) Usage(tenant string) TenantUsage {
	u := TenantUsage{Tenant: tenant, MaxSeries: s.currentLimits().For(tenant).MaxSeries}
	for g, f := range s.servedFSMs() {
		n := f.TenantActive(tenant)
		u.Series += n
		u.PerGroup = append(u.PerGroup, n)
		ts := s.shares.TenantShares(g, tenant)
		u.Shares = append(u.Shares, ts.Share)
		u.ShareMoves = append(u.ShareMoves, ts)
	}
	return u
}

// KnownTenant reports whether this node knows the tenant: a replica here has
// registered it (it sent series at some point, even if all are idle now), or the
// limits file names it. An unknown name is most often a typo, which an operator
// must be able to tell from a tenant that is merely idle.
func (s *Server) KnownTenant(tenant string) bool {
	for _, f := range s.servedFSMs() {
		if f.Tenant(tenant) != nil {
			return true
		}
	}
	return s.currentLimits().Has(tenant)
}

func (s *Server) handleTenant(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	if err := api.ValidateTenantID(tenant); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !s.KnownTenant(tenant) {
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf(
			"tenant %q is unknown on node %s: it never sent series to the groups this node holds and has no entry in the runtime limits (see /api/v1/tenants)",
			tenant, s.cfg.Node.ID))
		return
	}
	s.writeJSON(w, s.Usage(tenant))
}

// TenantSummary is one row of /api/v1/tenants.
type TenantSummary struct {
	Tenant    string `json:"tenant"`
	Series    int64  `json:"series"`     // active series over every group, as this node's replicas see them
	MaxSeries int64  `json:"max_series"` // effective limit; 0 = unlimited
	// FractionOfLimit is Series/MaxSeries; null when the tenant is unlimited.
	FractionOfLimit *float64 `json:"fraction_of_limit"`
}

// TenantList is one page of /api/v1/tenants.
type TenantList struct {
	Tenants []TenantSummary `json:"tenants"`
	// Total is the number of tenants over every page.
	Total int `json:"total"`
	// NextPageToken, passed as page_token, returns the next page; empty on
	// the last one.
	NextPageToken string `json:"next_page_token,omitempty"`
}

// Page sizes of the paginated lists (/api/v1/tenants, the tenants of
// /api/v1/overview): a default that keeps an answer well under a megabyte,
// and a bound a client may ask for.
const (
	defaultTenantPage  = 1000
	defaultOverviewTop = 500
	maxPage            = 10_000
)

// Tenants lists every tenant this node knows (see KnownTenant), sorted by name.
func (s *Server) Tenants() TenantList {
	series := map[string]int64{}
	for _, f := range s.servedFSMs() {
		for _, t := range f.Tenants() {
			series[t.Name] += t.Active()
		}
	}
	limits := s.currentLimits()
	for _, name := range limits.Overridden() {
		if _, ok := series[name]; !ok {
			series[name] = 0
		}
	}
	out := TenantList{Tenants: make([]TenantSummary, 0, len(series)), Total: len(series)}
	for name, n := range series {
		ts := TenantSummary{Tenant: name, Series: n, MaxSeries: limits.For(name).MaxSeries}
		if ts.MaxSeries > 0 {
			frac := float64(n) / float64(ts.MaxSeries)
			ts.FractionOfLimit = &frac
		}
		out.Tenants = append(out.Tenants, ts)
	}
	slices.SortFunc(out.Tenants, func(a, b TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// pageParams reads limit (1..maxPage, default def) and page_token.
func pageParams(r *http.Request, def int) (limit int, token string, e *httpjson.Error) {
	q, e := httpjson.Query(r)
	if e != nil {
		return 0, "", e
	}
	limit = def
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			return 0, "", httpjson.Bad("limit", "%q: want an integer in [1, %d] (default %d)", v, maxPage, def)
		}
		limit = n
	}
	return limit, q.Get("page_token"), nil
}

// Page tokens of /api/v1/tenants are the last name of the previous page,
// base64url-encoded: the list is sorted by name, so a page continues right
// after it even when tenants come and go between calls.
func tenantPageToken(after string) string { return base64.RawURLEncoding.EncodeToString([]byte(after)) }

func (s *Server) handleTenants(w http.ResponseWriter, r *http.Request) {
	limit, token, e := pageParams(r, defaultTenantPage)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	all := s.Tenants()
	start := 0
	if token != "" {
		after, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil || !utf8.Valid(after) {
			httpjson.WriteErr(w, httpjson.Bad("page_token", "not a token this endpoint returned (next_page_token)"))
			return
		}
		start, _ = slices.BinarySearchFunc(all.Tenants, string(after), func(t TenantSummary, name string) int { return strings.Compare(t.Tenant, name) })
		if start < len(all.Tenants) && all.Tenants[start].Tenant == string(after) {
			start++
		}
	}
	end := min(start+limit, len(all.Tenants))
	page := TenantList{Tenants: all.Tenants[start:end], Total: all.Total}
	if end < len(all.Tenants) {
		page.NextPageToken = tenantPageToken(all.Tenants[end-1].Tenant)
	}
	s.writeJSON(w, page)
}

// indexPage is the landing page: the dashboard first, then every endpoint; a new operator who
// opens the HTTP address in a browser lands here.
var indexPage = template.Must(template.New("index").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Tollgate {{.Node}}</title></head>
<body>
<h1>Tollgate node {{.Node}}</h1>
<p>Zone {{.Zone}}, gRPC {{.GRPC}}, {{.Build}}.</p>
<ul>
<li><a href="/ui/">/ui/</a>: the dashboard (cluster by zone, groups and leaders, tenants near their limits, rates)</li>
<li><a href="/api/v1/status">/api/v1/status</a>: this node's groups, leaders and applied indexes, the sampling controller, the top per-partition HLL estimates, month-to-date active-series bills (JSON)</li>
<li><a href="/api/v1/tenants">/api/v1/tenants</a>: tenants with active series and their limits (JSON)</li>
<li>/api/v1/tenants/<i>TENANT</i>: one tenant's usage per group (JSON; 404 for an unknown tenant)</li>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="/healthz">/healthz</a>: the process is up</li>
<li><a href="/readyz">/readyz</a>: the node can serve, or why not</li>
{{if .Debug}}<li><a href="/debug/pprof/">/debug/pprof/</a>: Go profiles (admin token required)</li>
{{end}}</ul>
</body></html>
`))

func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = indexPage.Execute(w, map[string]any{
		"Node": s.cfg.Node.ID, "Zone": s.cfg.Node.Zone, "GRPC": s.GRPCAddr(),
		"Build": version.Get().String(), "Debug": s.cfg.Access.EnableDebugEndpoints,
	})
}

// guardRoute applies the rule table to one route (access.Guard.Route).
func (s *Server) guardRoute(pattern string, h http.Handler) http.Handler {
	return s.guard.Route(pattern, h)
}

// requireAdmin applies the admin API's rule to an HTTP handler: with an admin
// token, the request must carry "Authorization: Bearer <token>"; without one,
// only loopback peers are served.
func (s *Server) requireAdmin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, msg := s.authorizeHTTP(r); code != 0 {
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate admin"`)
			}
			http.Error(w, msg, code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// authorizeHTTP returns 0 when r may use admin endpoints, else the HTTP status
// and the reason.
func (s *Server) authorizeHTTP(r *http.Request) (int, string) {
	var remote net.IP
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		remote = net.ParseIP(host)
	}
	switch s.adminVerdictFor(remote, r.Header.Values("Authorization")) {
	case adminNotLoopback:
		return http.StatusForbidden, "admin endpoint (debug, metering clock): no admin token is configured on this node, so only loopback clients may use it; start the server with --admin-token-file"
	case adminBadToken:
		return http.StatusUnauthorized, "admin endpoint (debug, metering clock): missing or wrong admin token (header \"Authorization: Bearer <token>\")"
	}
	return 0, ""
}

// writeJSON answers 200 with v, encoded completely first: a value that
// cannot be encoded is logged and answered 500, never 200 with an empty body.
func (s *Server) writeJSON(w http.ResponseWriter, v any) {
	httpjson.Write(w, s.log, http.StatusOK, v)
}

// writeJSONError answers {"error": msg} so scripts reading JSON get a reason,
// not an HTML or plain-text body.
func writeJSONError(w http.ResponseWriter, code int, msg string) {
	httpjson.WriteError(w, code, msg)
}
