package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// The REST contract (api/openapi.yaml) is checked against a running node:
// every route the node mounts must be in the document, every operation in the
// document is called here, and every request and real response is validated
// with kin-openapi, so the document cannot drift from the server.

func init() {
	// HTML pages (the landing page, the dashboard, pprof's index) are
	// validated as strings, as kin-openapi does text/plain.
	openapi3filter.RegisterBodyDecoder("text/html", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(r)
		return string(b), err
	})
}

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

// startNode starts a real single-node cluster with everything that serves
// HTTP routes turned on: metering with the test clock, debug endpoints, a
// limits file naming a tenant.
func startNode(t *testing.T) *server.Server {
	t.Helper()
	dir := t.TempDir()
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte("defaults:\n  max_series: 1000\ntenants:\n  acme:\n    max_series: 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Nodes: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.Node.ID, cfg.Node.HTTPAddr = "dev", "127.0.0.1:0"
		cfg.Limits.File, cfg.Access.EnableDebugEndpoints = limits, true
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cfg.Metering.TestClock = true
	}}).Node(0)
}

// patternPath turns a net/http ServeMux pattern into its method ("" for
// any) and OpenAPI path.
func patternPath(p string) (method, path string) {
	if m, rest, ok := strings.Cut(p, " "); ok {
		method, p = m, rest
	}
	return method, strings.ReplaceAll(p, "{$}", "")
}

func TestOpenAPICoversEveryRoute(t *testing.T) {
	doc := loadSpec(t)
	s := startNode(t)
	routes := s.HTTPRoutes()
	if len(routes) < 15 {
		t.Fatalf("the node lists %d routes: %v", len(routes), routes)
	}
	for _, r := range routes {
		method, path := patternPath(r)
		item := doc.Paths.Value(path)
		if item == nil {
			t.Errorf("route %q: api/openapi.yaml has no path %s", r, path)
			continue
		}
		if method == "" {
			if len(item.Operations()) == 0 {
				t.Errorf("route %q: api/openapi.yaml has no operation on %s", r, path)
			}
			continue
		}
		if item.GetOperation(method) == nil {
			t.Errorf("route %q: api/openapi.yaml has no %s %s", r, method, path)
		}
	}
}

// call is one request of the contract test and the status it must get.
type call struct {
	method, path string
	body         string
	contentType  string
	want         int
}

func TestOpenAPIResponses(t *testing.T) {
	doc := loadSpec(t)
	s := startNode(t)
	base := "http://" + s.HTTPAddr()
	doc.Servers = openapi3.Servers{{URL: base}}
	closeObjects(doc)
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}

	// Give every endpoint something to report: series for acme and another
	// tenant over the gRPC API, a backlog controller in the runtime config.
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := api.NewTrackerClient(cc)
	parts := map[int][]uint64{}
	for h := uint64(1); len(parts) < 8; h += 0x9E3779B97F4A7C15 {
		p := api.Partition(h, api.DefaultPartitions)
		parts[p] = append(parts[p], h)
	}
	for p, hs := range parts {
		for _, tenant := range []string{"acme", "beta"} {
			if _, err := tr.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(p), Hashes: hs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := api.NewConfigClient(cc).SetLimits(ctx, &api.SetLimitsRequest{Global: true, Set: map[string]string{
		"backlog_controller.kind": "locate", "backlog_controller.target": "1000", "backlog_controller.period": "1s",
		"backlog_controller.kp": "0.5"}}); err != nil {
		t.Fatal(err)
	}

	now := time.Now().UnixMilli()
	event := func(id string, ts int64) string {
		return fmt.Sprintf(`{"id":%q,"timestamp":%d,"organization_id":"org","space_id":"space","consumer_id":"app","resource_id":"db",`+
			`"plan_id":"standard","resource_instance_id":"db-1","measured_usage":[{"measure":"memory_gb","quantity":2}]}`, id, ts)
	}
	stop := func(id string, ts int64) string { // a stop carries no measures
		return strings.Replace(event(id, ts), `,"measured_usage":[{"measure":"memory_gb","quantity":2}]`, "", 1)
	}
	hour := int64(time.Hour / time.Millisecond)
	from, to := now-24*hour, now+48*hour
	calls := []call{
		{method: "GET", path: "/healthz", want: 200},
		{method: "GET", path: "/readyz", want: 200},
		{method: "GET", path: "/metrics", want: 200},
		{method: "GET", path: "/", want: 200},
		{method: "GET", path: "/ui/", want: 200},
		{method: "GET", path: "/ui/app.js", want: 200},
		{method: "GET", path: "/ui/no-such-file.js", want: 404},
		{method: "GET", path: "/api/v1/status", want: 200},
		{method: "GET", path: "/api/v1/overview", want: 200},
		{method: "GET", path: "/api/v1/tenants", want: 200},
		{method: "GET", path: "/api/v1/tenants/acme", want: 200},
		{method: "GET", path: "/api/v1/tenants/nobody", want: 404},
		{method: "GET", path: "/api/v1/sketches?top=5", want: 200},
		{method: "GET", path: "/api/v1/sketches?top=0", want: 400},
		{method: "POST", path: "/api/v1/backlog", body: `{"kind":"locate","backlog":3000,"source":"q1"}`, want: 200},
		{method: "POST", path: "/api/v1/backlog", body: `{"kind":"other","backlog":1}`, want: 422},
		{method: "POST", path: "/v1/events/start", body: event("e1", now), want: 201},
		{method: "POST", path: "/v1/events/start", body: event("e1", now), want: 201}, // duplicate
		{method: "POST", path: "/v1/events", body: `{"events":[` + strings.Replace(event("e2", now), "{", `{"kind":"start",`, 1) + `]}`, want: 200},
		{method: "POST", path: "/v1/events/stop", body: stop("e3", now+2*hour), want: 201},
		{method: "POST", path: "/v1/events/stop", body: event("e4", now+2*hour), want: 400},
		{method: "POST", path: "/v1/metering/clock", body: fmt.Sprintf(`{"set_ms":%d}`, now+3*hour), want: 200},
		{method: "POST", path: "/v1/metering/clock", body: `{"advance_ms":-1}`, want: 400},
		{method: "GET", path: "/v1/metering/status", want: 200},
		{method: "GET", path: "/v1/metering/dead-letters", want: 200},
		{method: "GET", path: fmt.Sprintf("/v1/usage?organization_id=org&from=%d&to=%d", from, to), want: 200},
		{method: "GET", path: "/v1/usage?from=yesterday", want: 400},
		{method: "GET", path: fmt.Sprintf("/v1/usage/bill?tenant=acme&from=%d&to=%d", from, to), want: 200},
		{method: "GET", path: "/v1/usage/bill?tenant=acme", want: 400},
		{method: "GET", path: "/debug/pprof/", want: 200},
		{method: "GET", path: "/debug/pprof/heap?debug=1", want: 200},
		{method: "GET", path: "/debug/pprof/cmdline", want: 200},
		{method: "GET", path: "/debug/pprof/profile?seconds=1", want: 200},
		{method: "GET", path: "/debug/pprof/symbol", want: 200},
		{method: "POST", path: "/debug/pprof/symbol", body: "0x1", contentType: "text/plain", want: 200},
		{method: "GET", path: "/debug/pprof/trace?seconds=0.1", want: 200},
	}
	called := map[string]bool{}
	for _, c := range calls {
		body := do(t, router, base, c)
		route, _, _ := router.FindRoute(mustReq(t, c.method, base+c.path, ""))
		called[c.method+" "+route.Path] = true
		// Usage records appear once the sampler ran after the clock moved:
		// the records query is retried until it returns one, so the record
		// schema is checked against a real record.
		if strings.HasPrefix(c.path, "/v1/usage?organization_id") {
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(body, "usage_id") && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				body = do(t, router, base, c)
			}
			if !strings.Contains(body, "usage_id") {
				t.Errorf("no usage record after the clock moved three hours: %s", body)
			}
		}
	}
	// Every operation of the document was exercised.
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !called[method+" "+path] {
				t.Errorf("%s %s is in api/openapi.yaml but this test never calls it", method, path)
			}
		}
	}
}

// closeObjects forbids undocumented properties in every object schema with
// properties, for this test only: the published document lets clients ignore
// fields added later, but a field the server sends must be documented.
func closeObjects(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	// Members of a composition (allOf of several) stay open: each sees only
	// its own properties. A single-member allOf (a nullable reference) does not.
	open := map[*openapi3.Schema]bool{}
	for _, r := range doc.Components.Schemas {
		if len(r.Value.AllOf) < 2 {
			continue
		}
		for _, x := range r.Value.AllOf {
			open[x.Value] = true
		}
	}
	var walk func(*openapi3.SchemaRef)
	walk = func(r *openapi3.SchemaRef) {
		if r == nil || r.Value == nil || seen[r.Value] {
			return
		}
		v := r.Value
		seen[v] = true
		if len(v.Properties) > 0 && v.AdditionalProperties.Has == nil && v.AdditionalProperties.Schema == nil && !open[v] {
			no := false
			v.AdditionalProperties.Has = &no
		}
		for _, p := range v.Properties {
			walk(p)
		}
		walk(v.Items)
		walk(v.AdditionalProperties.Schema)
		for _, l := range [][]*openapi3.SchemaRef{v.AllOf, v.AnyOf, v.OneOf} {
			for _, x := range l {
				walk(x)
			}
		}
	}
	for _, s := range doc.Components.Schemas {
		walk(s)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				for _, mt := range resp.Value.Content {
					walk(mt.Schema)
				}
			}
		}
	}
	for _, resp := range doc.Components.Responses {
		for _, mt := range resp.Value.Content {
			walk(mt.Schema)
		}
	}
}

func mustReq(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// do sends c, validating the request and the response against the document,
// and checks the status; it returns the response body.
func do(t *testing.T, router routers.Router, base string, c call) string {
	t.Helper()
	name := c.method + " " + c.path
	req := mustReq(t, c.method, base+c.path, c.body)
	if c.body != "" {
		ct := c.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s: not in api/openapi.yaml: %v", name, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	// A request the test expects to be refused may break the document's
	// rules on purpose; only those expected to succeed must conform.
	if c.want < 400 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("%s: request does not conform: %v", name, err)
		}
		req.Body = io.NopCloser(strings.NewReader(c.body))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != c.want {
		t.Errorf("%s: status %d, want %d: %.300s", name, resp.StatusCode, c.want, b)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	out.SetBodyBytes(b)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s: response %d does not conform to api/openapi.yaml: %v\n%.500s", name, resp.StatusCode, err, b)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && !json.Valid(bytes.TrimSpace(b)) {
		t.Errorf("%s: invalid JSON", name)
	}
	return string(b)
}

// TestOpenAPISecurityMatchesRules: every operation of api/openapi.yaml names
// the credential its route needs, as the node's access rules (access/rules.go)
// decide it: the scheme named after the scope, or an explicit empty list for
// the open routes.
func TestOpenAPISecurityMatchesRules(t *testing.T) {
	doc := loadSpec(t)
	s := startNode(t)
	for _, r := range s.HTTPRoutes() {
		scope, ok := access.HTTPRouteScope(r)
		if !ok {
			t.Errorf("route %q has no access rule", r)
			continue
		}
		method, path := patternPath(r)
		item := doc.Paths.Value(path)
		if item == nil {
			continue // TestOpenAPICoversEveryRoute names it
		}
		ops := item.Operations()
		if method != "" {
			ops = map[string]*openapi3.Operation{method: item.GetOperation(method)}
		}
		for m, op := range ops {
			if op == nil {
				continue
			}
			if op.Security == nil {
				t.Errorf("%s %s: no security requirement; the route needs %q", m, path, scope)
				continue
			}
			var names []string
			for _, req := range *op.Security {
				for name := range req {
					names = append(names, name)
				}
			}
			want := []string{}
			if scope != "" {
				want = []string{scope}
			}
			if fmt.Sprint(names) != fmt.Sprint(want) {
				t.Errorf("%s %s: security %v, the route needs %v", m, path, names, want)
			}
		}
	}
}
