package access

import (
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/httpjson"
)

// Rule is what one endpoint needs when credentials are configured
// (--credentials-file): a scope ("" = public) and the tenants a request
// acts on. No tenants (nil) means the endpoint reads or writes every tenant's
// data, which a credential limited to tenants may not, unless Shared: data
// every client of the cluster needs (layout, near-limit sets), open to any
// credential with the scope.
type Rule struct {
	name   string // the method or pattern, for refusals
	Scope  Scope
	Shared bool
	// GRPCTenants extracts the tenants of a unary gRPC request; nil: all.
	GRPCTenants func(req any) []string
	// HTTPTenants extracts the tenants of an HTTP request from its path or
	// query, after the mux matched it (path values are set); nil: all.
	HTTPTenants func(r *http.Request) []string
	// InHandler: the tenants are in the request body (or stream), which
	// only the handler parses. The access check authenticates the caller
	// and checks the scope before the body is read, and attaches the
	// credential's tenants to the context (tenantscope); the handler checks
	// exactly the tenants it parsed, before it writes anything.
	InHandler bool
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
var grpcRules = map[string]Rule{
	api.Tracker_TrackSeries_FullMethodName:          {Scope: ScopeTrack, GRPCTenants: func(r any) []string { return []string{r.(*api.TrackSeriesRequest).GetTenant()} }},
	api.Tracker_GetUsersCloseToLimit_FullMethodName: {Scope: ScopeTrack, Shared: true},
	api.Tracker_WatchCluster_FullMethodName:         {Scope: ScopeTrack, Shared: true},
	api.Summaries_WatchSummaries_FullMethodName:     {Scope: ScopeTrack, Shared: true},
	api.Sketches_WatchSketches_FullMethodName:       {Scope: ScopeTrack, Shared: true},
	// The tenant names a Sync stream introduces are checked by the service
	// as they arrive (service/ratelimit, tenantscope).
	api.RateLimit_Sync_FullMethodName: {Scope: ScopeTrack, InHandler: true},
	// A lease client asking a key's owner to decide a request now.
	api.RateAdmit_Admit_FullMethodName: {Scope: ScopeTrack, Shared: true},
	// Envoy's rate limit service: descriptors are Envoy's, not tenants.
	rlsv3.RateLimitService_ShouldRateLimit_FullMethodName: {Scope: ScopeTrack, Shared: true},
	// A node's wall clock, for peers measuring their offsets (as NTP would
	// answer anyone); the offsets it measured are cluster state.
	api.Clock_Now_FullMethodName:     {},
	api.Clock_Offsets_FullMethodName: {Scope: ScopeRead},
	api.Sketches_PushSketches_FullMethodName: {Scope: ScopeTrack, GRPCTenants: func(r any) []string {
		var out []string
		for _, s := range r.(*api.PushSketchesRequest).GetSketches() {
			out = append(out, s.GetTenant())
		}
		return out
	}},

	api.Metering_Start_FullMethodName: {Scope: ScopeMeter, GRPCTenants: func(r any) []string {
		return []string{r.(*api.MeterEvent).GetTarget().GetOrganizationId()}
	}},
	api.Metering_Stop_FullMethodName: {Scope: ScopeMeter, GRPCTenants: func(r any) []string {
		return []string{r.(*api.MeterEvent).GetTarget().GetOrganizationId()}
	}},
	api.Metering_Events_FullMethodName: {Scope: ScopeMeter, GRPCTenants: func(r any) []string {
		out := []string{}
		for _, e := range r.(*api.MeterEventsRequest).GetEvents() {
			out = append(out, e.GetEvent().GetTarget().GetOrganizationId())
		}
		return out
	}},
	api.Metering_QueryUsage_FullMethodName: {Scope: ScopeRead, GRPCTenants: func(r any) []string {
		return one(r.(*api.QueryUsageRequest).GetTarget().GetOrganizationId())
	}},
	api.Metering_SeriesSamples_FullMethodName:      {Scope: ScopeRead, GRPCTenants: func(r any) []string { return one(r.(*api.SeriesSamplesRequest).GetTenant()) }},
	api.Metering_GroupSeriesSamples_FullMethodName: {Scope: ScopeRead},
	api.Metering_SetClock_FullMethodName:           {Scope: ScopeAdmin},

	api.Admin_Status_FullMethodName:             {Scope: ScopeAdmin},
	api.Admin_ListPeers_FullMethodName:          {Scope: ScopeAdmin},
	api.Admin_AddVoter_FullMethodName:           {Scope: ScopeAdmin},
	api.Admin_RemoveServer_FullMethodName:       {Scope: ScopeAdmin},
	api.Admin_TransferLeadership_FullMethodName: {Scope: ScopeAdmin},
	api.Admin_NodeGroups_FullMethodName:         {Scope: ScopeAdmin},
	api.Admin_SnapshotGroup_FullMethodName:      {Scope: ScopeAdmin},
	api.Admin_RestoreGroup_FullMethodName:       {Scope: ScopeAdmin},
	api.Admin_DropTenant_FullMethodName:         {Scope: ScopeAdmin},
	api.Admin_DrainNode_FullMethodName:          {Scope: ScopeAdmin},
	api.Admin_RaiseGroups_FullMethodName:        {Scope: ScopeAdmin},
	api.Config_GetLimits_FullMethodName:         {Scope: ScopeAdmin},
	api.Config_SetLimits_FullMethodName:         {Scope: ScopeAdmin},
	api.Config_ApplyLimits_FullMethodName:       {Scope: ScopeAdmin},
	api.Config_ReplicateLimits_FullMethodName:   {Scope: ScopeAdmin},
	api.Config_ReportBacklog_FullMethodName:     {Scope: ScopeAdmin},
	api.Shares_Give_FullMethodName:              {Scope: ScopeAdmin},
	api.Shares_Receive_FullMethodName:           {Scope: ScopeAdmin},
	api.Shares_Complete_FullMethodName:          {Scope: ScopeAdmin},
	api.Shares_TenantShares_FullMethodName:      {Scope: ScopeAdmin},
	api.Shares_Cover_FullMethodName:             {Scope: ScopeAdmin},
	api.PartitionMoves_Give_FullMethodName:      {Scope: ScopeAdmin},
	api.PartitionMoves_Receive_FullMethodName:   {Scope: ScopeAdmin},
	api.PartitionMoves_Complete_FullMethodName:  {Scope: ScopeAdmin},
	api.PartitionMoves_State_FullMethodName:     {Scope: ScopeAdmin},
	// Node to node: a moved rate key's previous owner hands it over.
	api.RateAdmit_Handoff_FullMethodName: {Scope: ScopeAdmin},
}

// httpRules: every HTTP route of the node (the mux pattern), one line each;
// like grpcRules, a route without a line is refused when credentials are
// configured.
var httpRules = map[string]Rule{
	"GET /healthz":         {},
	"GET /readyz":          {},
	"GET /metrics":         {}, // no tenant names: per-group and per-node figures
	"GET /{$}":             {},
	"GET /ui/":             {}, // static files; the data they show needs read
	"GET /api/v1/status":   {Scope: ScopeRead},
	"GET /api/v1/sketches": {Scope: ScopeRead},
	"GET /api/v1/tenants":  {Scope: ScopeRead},
	"GET /api/v1/tenants/{tenant}": {Scope: ScopeRead, HTTPTenants: func(r *http.Request) []string {
		return []string{r.PathValue("tenant")} // the value the handler reads
	}},
	"GET /api/v1/overview":  {Scope: ScopeRead},
	"/api/v1/backlog":       {Scope: ScopeAdmin},
	"POST /v1/events/start": {Scope: ScopeMeter, InHandler: true},
	"POST /v1/events/stop":  {Scope: ScopeMeter, InHandler: true},
	"POST /v1/events":       {Scope: ScopeMeter, InHandler: true},
	"GET /v1/usage": {Scope: ScopeRead, HTTPTenants: func(r *http.Request) []string {
		return one(queryValue(r, "organization_id"))
	}},
	"GET /v1/usage/bill": {Scope: ScopeRead, HTTPTenants: func(r *http.Request) []string {
		return []string{queryValue(r, "tenant")}
	}},
	"GET /v1/metering/status":       {Scope: ScopeRead},
	"GET /v1/metering/dead-letters": {Scope: ScopeRead},
	"POST /v1/metering/clock":       {Scope: ScopeAdmin},
	"/debug/pprof/":                 {Scope: ScopeAdmin},
	"/debug/pprof/cmdline":          {Scope: ScopeAdmin},
	"/debug/pprof/profile":          {Scope: ScopeAdmin},
	"/debug/pprof/symbol":           {Scope: ScopeAdmin},
	"/debug/pprof/trace":            {Scope: ScopeAdmin},
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

// GRPCRule is the rule of a gRPC method (its full name); ok is false for
// a method without one, which is refused while credentials are configured.
func GRPCRule(method string) (r Rule, ok bool) {
	r, ok = grpcRules[method]
	return r, ok
}

// HTTPRule is the rule of an HTTP route (its mux pattern); ok is false for
// a route without one, which is refused while credentials are configured.
func HTTPRule(pattern string) (r Rule, ok bool) {
	r, ok = httpRules[pattern]
	return r, ok
}

// HTTPRouteScope returns the credential scope an HTTP route (its mux pattern,
// as HTTPRoutes lists them) needs once credentials are configured: "" for the
// open routes. ok is false for a route without a rule. api/openapi.yaml's
// security requirements are checked against it.
func HTTPRouteScope(pattern string) (scope string, ok bool) {
	r, ok := httpRules[pattern]
	return string(r.Scope), ok
}
