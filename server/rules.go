package server

import (
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/httpjson"
)

// rule is what one endpoint needs when credentials are configured
// (--credentials-file): a scope ("" = public) and the tenants a request
// acts on. tenants nil means the endpoint reads or writes every tenant's
// data, which a credential limited to tenants may not, unless shared: data
// every client of the cluster needs (layout, near-limit sets), open to any
// credential with the scope.
type rule struct {
	name   string
	scope  Scope
	shared bool
	// grpcTenants extracts the tenants of a unary gRPC request; nil: all.
	grpcTenants func(req any) []string
	// httpTenants extracts the tenants of an HTTP request from its path or
	// query, after the mux matched it (path values are set); nil: all.
	httpTenants func(r *http.Request) []string
	// inHandler: the tenants are in the request body (or stream), which
	// only the handler parses. The access check authenticates the caller
	// and checks the scope before the body is read, and attaches the
	// credential's tenants to the context (tenantscope); the handler checks
	// exactly the tenants it parsed, before it writes anything.
	inHandler bool
}

// queryValue is key's value as the handlers read it (httpjson.Query); ""
// for a query they refuse.
func queryValue(r *http.Request, key string) string {
	q, e := httpjson.Query(r)
	if e != nil {
		return ""
	}
	return q.Get(key)
}

func one(t string) []string {
	if t == "" {
		return nil // no tenant named: every tenant
	}
	return []string{t}
}

// grpcRules: every gRPC method of the node, one line each. A method with no
// line is refused when credentials are configured (fail closed), and the
// endpoint test fails until it gets one.
var grpcRules = map[string]rule{
	api.Tracker_TrackSeries_FullMethodName:          {scope: ScopeTrack, grpcTenants: func(r any) []string { return []string{r.(*api.TrackSeriesRequest).GetTenant()} }},
	api.Tracker_GetUsersCloseToLimit_FullMethodName: {scope: ScopeTrack, shared: true},
	api.Tracker_WatchCluster_FullMethodName:         {scope: ScopeTrack, shared: true},
	api.Summaries_WatchSummaries_FullMethodName:     {scope: ScopeTrack, shared: true},
	api.Sketches_WatchSketches_FullMethodName:       {scope: ScopeTrack, shared: true},
	// The tenant names a Sync stream introduces are checked by the service
	// as they arrive (service/ratelimit, tenantscope).
	api.RateLimit_Sync_FullMethodName: {scope: ScopeTrack, inHandler: true},
	// A lease client asking a key's owner to decide a request now.
	api.RateAdmitMethod: {scope: ScopeTrack, shared: true},
	// Envoy's rate limit service: descriptors are Envoy's, not tenants.
	rlsv3.RateLimitService_ShouldRateLimit_FullMethodName: {scope: ScopeTrack, shared: true},
	// A node's wall clock, for peers measuring their offsets (as NTP would
	// answer anyone); the offsets it measured are cluster state.
	api.Clock_Now_FullMethodName:     {},
	api.Clock_Offsets_FullMethodName: {scope: ScopeRead},
	api.Sketches_PushSketches_FullMethodName: {scope: ScopeTrack, grpcTenants: func(r any) []string {
		var out []string
		for _, s := range r.(*api.PushSketchesRequest).GetSketches() {
			out = append(out, s.GetTenant())
		}
		return out
	}},

	api.Metering_Start_FullMethodName: {scope: ScopeMeter, grpcTenants: func(r any) []string {
		return []string{r.(*api.MeterEvent).GetTarget().GetOrganizationId()}
	}},
	api.Metering_Stop_FullMethodName: {scope: ScopeMeter, grpcTenants: func(r any) []string {
		return []string{r.(*api.MeterEvent).GetTarget().GetOrganizationId()}
	}},
	api.Metering_Events_FullMethodName: {scope: ScopeMeter, grpcTenants: func(r any) []string {
		out := []string{}
		for _, e := range r.(*api.MeterEventsRequest).GetEvents() {
			out = append(out, e.GetEvent().GetTarget().GetOrganizationId())
		}
		return out
	}},
	api.Metering_QueryUsage_FullMethodName: {scope: ScopeRead, grpcTenants: func(r any) []string {
		return one(r.(*api.QueryUsageRequest).GetTarget().GetOrganizationId())
	}},
	api.Metering_SeriesSamples_FullMethodName:      {scope: ScopeRead, grpcTenants: func(r any) []string { return one(r.(*api.SeriesSamplesRequest).GetTenant()) }},
	api.Metering_GroupSeriesSamples_FullMethodName: {scope: ScopeRead},
	api.Metering_SetClock_FullMethodName:           {scope: ScopeAdmin},

	api.Admin_Status_FullMethodName:             {scope: ScopeAdmin},
	api.Admin_ListPeers_FullMethodName:          {scope: ScopeAdmin},
	api.Admin_AddVoter_FullMethodName:           {scope: ScopeAdmin},
	api.Admin_RemoveServer_FullMethodName:       {scope: ScopeAdmin},
	api.Admin_TransferLeadership_FullMethodName: {scope: ScopeAdmin},
	api.Admin_NodeGroups_FullMethodName:         {scope: ScopeAdmin},
	api.Admin_SnapshotGroup_FullMethodName:      {scope: ScopeAdmin},
	api.Admin_RestoreGroup_FullMethodName:       {scope: ScopeAdmin},
	api.Admin_DropTenant_FullMethodName:         {scope: ScopeAdmin},
	api.Admin_DrainNode_FullMethodName:          {scope: ScopeAdmin},
	api.Config_GetLimits_FullMethodName:         {scope: ScopeAdmin},
	api.Config_SetLimits_FullMethodName:         {scope: ScopeAdmin},
	api.Config_ApplyLimits_FullMethodName:       {scope: ScopeAdmin},
	api.Config_ReplicateLimits_FullMethodName:   {scope: ScopeAdmin},
	api.Config_ReportBacklog_FullMethodName:     {scope: ScopeAdmin},
	api.Shares_Give_FullMethodName:              {scope: ScopeAdmin},
	api.Shares_Receive_FullMethodName:           {scope: ScopeAdmin},
	api.Shares_Complete_FullMethodName:          {scope: ScopeAdmin},
	api.Shares_TenantShares_FullMethodName:      {scope: ScopeAdmin},
	api.Shares_Cover_FullMethodName:             {scope: ScopeAdmin},
}

// httpRules: every HTTP route of the node (the mux pattern), one line each;
// like grpcRules, a route without a line is refused when credentials are
// configured.
var httpRules = map[string]rule{
	"GET /healthz":         {},
	"GET /readyz":          {},
	"GET /metrics":         {}, // no tenant names: per-group and per-node figures
	"GET /{$}":             {},
	"GET /ui/":             {}, // static files; the data they show needs read
	"GET /api/v1/status":   {scope: ScopeRead},
	"GET /api/v1/sketches": {scope: ScopeRead},
	"GET /api/v1/tenants":  {scope: ScopeRead},
	"GET /api/v1/tenants/{tenant}": {scope: ScopeRead, httpTenants: func(r *http.Request) []string {
		return []string{r.PathValue("tenant")} // the value the handler reads
	}},
	"GET /api/v1/overview":  {scope: ScopeRead},
	"/api/v1/backlog":       {scope: ScopeAdmin},
	"POST /v1/events/start": {scope: ScopeMeter, inHandler: true},
	"POST /v1/events/stop":  {scope: ScopeMeter, inHandler: true},
	"POST /v1/events":       {scope: ScopeMeter, inHandler: true},
	"GET /v1/usage": {scope: ScopeRead, httpTenants: func(r *http.Request) []string {
		return one(queryValue(r, "organization_id"))
	}},
	"GET /v1/usage/bill": {scope: ScopeRead, httpTenants: func(r *http.Request) []string {
		return []string{queryValue(r, "tenant")}
	}},
	"GET /v1/metering/status":       {scope: ScopeRead},
	"GET /v1/metering/dead-letters": {scope: ScopeRead},
	"POST /v1/metering/clock":       {scope: ScopeAdmin},
	"/debug/pprof/":                 {scope: ScopeAdmin},
	"/debug/pprof/cmdline":          {scope: ScopeAdmin},
	"/debug/pprof/profile":          {scope: ScopeAdmin},
	"/debug/pprof/symbol":           {scope: ScopeAdmin},
	"/debug/pprof/trace":            {scope: ScopeAdmin},
}

func init() {
	for m, r := range grpcRules {
		r.name = m
		grpcRules[m] = r
	}
	for p, r := range httpRules {
		r.name = p
		httpRules[p] = r
	}
}

// HTTPRouteScope returns the credential scope an HTTP route (its mux pattern,
// as HTTPRoutes lists them) needs once credentials are configured: "" for the
// open routes. ok is false for a route without a rule. api/openapi.yaml's
// security requirements are checked against it.
func HTTPRouteScope(pattern string) (scope string, ok bool) {
	r, ok := httpRules[pattern]
	return string(r.scope), ok
}
