package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// meteringSpans is the number of spans the node's metering groups hold
// (open or stopped): an event that was written shows up here at once.
func meteringSpans(s *Server) int {
	n := 0
	for _, g := range s.meter.Status().Groups {
		n += g.Spans
	}
	return n
}

// postRaw sends one raw HTTP/1.1 request to s and returns the status code
// of the answer (0 when the node closed the connection without one).
func postRaw(t *testing.T, s *Server, raw string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", s.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestMeteringCrossTenantOddBodies: a meter credential limited to tenant
// "a" never writes tenant "b"'s events, whatever the body looks like: a
// batch with one non-object item next to b's event, a chunked body whose
// last chunk is malformed after a complete document naming b, duplicate
// keys, a single event, and the gRPC calls. The node's access check once
// parsed the body with a parser of its own, which gave up on these bodies
// (no tenant named: allowed) while the handler wrote b's event. The same
// credential writing its own tenant's event shows the probe can see a
// write.
func TestMeteringCrossTenantOddBodies(t *testing.T) {
	creds := writeCredentials(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.AdminToken, c.Access.CredentialsFile = accessAdminToken, creds })
	defer stop(t, s)

	evB := accessEvent("b", true)
	itemB := `{"kind":"start",` + evB[1:]
	chunked := func(path, doc string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-meter-a\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nZZ\r\n\r\n", path, len(doc), doc)
	}
	post := func(path, body string) (int, string) {
		return postRaw(t, s, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-meter-a\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, len(body), body))
	}
	cases := []struct {
		name string
		send func() (int, string)
	}{
		{"batch with a non-object item", func() (int, string) { return post("/v1/events", `{"events":[1,`+itemB+`]}`) }},
		{"batch with a string item", func() (int, string) { return post("/v1/events", `{"events":["x",`+itemB+`]}`) }},
		{"batch with null item", func() (int, string) { return post("/v1/events", `{"events":[null,`+itemB+`]}`) }},
		{"batch with an unknown top-level field", func() (int, string) { return post("/v1/events", `{"x":1,"events":[`+itemB+`]}`) }},
		{"batch, organization_id twice", func() (int, string) {
			return post("/v1/events", `{"events":[`+strings.Replace(itemB, `"organization_id":"b"`, `"organization_id":"a","organization_id":"b"`, 1)+`]}`)
		}},
		{"batch, malformed chunked", func() (int, string) { return postRaw(t, s, chunked("/v1/events", `{"events":[`+itemB+`]}`)) }},
		{"single event, malformed chunked", func() (int, string) { return postRaw(t, s, chunked("/v1/events/start", evB)) }},
		{"single event", func() (int, string) { return post("/v1/events/start", evB) }},
		{"single event, organization_id twice", func() (int, string) {
			return post("/v1/events/start", strings.Replace(evB, `"organization_id":"b"`, `"organization_id":"a","organization_id":"b"`, 1))
		}},
	}
	written := 0
	for i, c := range cases {
		// Each case writes b's event under its own id, so one case's
		// write cannot hide another's as a duplicate.
		c.name = fmt.Sprintf("#%d %s", i, c.name)
		evB = strings.Replace(strings.Replace(accessEvent("b", true), `"access-b"`, fmt.Sprintf(`"odd-%d"`, i), 1),
			`"resource_instance_id":"i"`, fmt.Sprintf(`"resource_instance_id":"i%d"`, i), 1)
		itemB = `{"kind":"start",` + evB[1:]
		code, body := c.send()
		if code != http.StatusForbidden && code != http.StatusBadRequest && code != 0 {
			t.Errorf("%s: %d %.300s, want 403 or 400", c.name, code, body)
		}
		if n := meteringSpans(s); n != written {
			t.Errorf("%s: tenant b got %d spans written by a credential limited to a (answer %d %.300s)", c.name, n-written, code, body)
			written = n
		}
	}
	if written != 0 {
		t.FailNow()
	}

	// gRPC: the interceptor decides on the message the handler gets.
	cc := dialAnon(t, s.GRPCAddr())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok-meter-a")
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	mc := api.NewMeteringClient(cc)
	now := time.Now().UnixMilli()
	target := func(org string) *api.MeterTarget {
		return &api.MeterTarget{OrganizationId: org, SpaceId: "s", ConsumerId: "c", ResourceId: "r", PlanId: "p", ResourceInstanceId: "i"}
	}
	ev := func(org string) *api.MeterEvent {
		return &api.MeterEvent{Id: "g-" + org, Timestamp: now, Target: target(org), MeasuredUsage: []*api.MeterMeasure{{Measure: "m", Quantity: 1}}}
	}
	if _, err := mc.Start(ctx, ev("b")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gRPC Start for b: %v, want PermissionDenied", err)
	}
	if _, err := mc.Events(ctx, &api.MeterEventsRequest{Events: []*api.MeterEventItem{{}, {Event: ev("b")}}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gRPC Events with an empty item and b's event: %v, want PermissionDenied", err)
	}
	if n := meteringSpans(s); n != 0 {
		t.Fatalf("gRPC: tenant b has %d spans", n)
	}

	// The credential's own tenant: written, so the probe sees writes.
	if code, body := post("/v1/events", `{"events":[{"kind":"start",`+accessEvent("a", true)[1:]+`]}`); code != http.StatusOK || !strings.Contains(body, `"status": 201`) {
		t.Fatalf("a's own event: %d %s", code, body)
	}
	if n := meteringSpans(s); n != 1 {
		t.Fatalf("after a's own event: %d spans, want 1", n)
	}
}

// TestRateSyncScopedToTenants: a RateLimit.Sync stream of a credential
// limited to tenant "a" that introduces tenant "b" ends with
// PermissionDenied (it once reported consumption for any tenant, pushing
// other tenants' requests to denial); introducing "a" is served.
func TestRateSyncScopedToTenants(t *testing.T) {
	creds := writeCredentials(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.AdminToken, c.Access.CredentialsFile = accessAdminToken, creds })
	defer stop(t, s)
	cc := dialAnon(t, s.GRPCAddr())
	for _, c := range []struct {
		names []string
		want  codes.Code
	}{{[]string{"b"}, codes.PermissionDenied}, {[]string{"a", "b"}, codes.PermissionDenied}, {[]string{"a"}, codes.DeadlineExceeded}} {
		code := syncOnce(t, cc, "Bearer tok-track-a", c.names, 2*time.Second)
		if code != c.want {
			t.Errorf("Sync introducing %v as track-a: %s, want %s", c.names, code, c.want)
		}
	}
}

// syncOnce opens a Sync stream with tok, sends one report introducing
// names with consumption, and returns the stream's end code
// (DeadlineExceeded: still open after wait).
func syncOnce(t *testing.T, cc *grpc.ClientConn, tok string, names []string, wait time.Duration) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", tok), wait)
	defer cancel()
	st, err := api.NewRateLimitClient(cc).Sync(ctx)
	if err != nil {
		return status.Code(err)
	}
	r := syncReport(names)
	if err := st.Send(r); err != nil && err != io.EOF {
		return status.Code(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			return status.Code(err)
		}
	}
}

func syncReport(names []string) *api.RateReport {
	r := &api.RateReport{ClientId: 99, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}
	for i, n := range names {
		r.NewIds = append(r.NewIds, uint32(i+1))
		r.NewNames = append(r.NewNames, n)
		r.Ids = append(r.Ids, uint32(i+1))
		r.ConsumedTotal = append(r.ConsumedTotal, 1_000_000)
		r.OfferedTotal = append(r.OfferedTotal, 1_000_000)
	}
	return r
}

// TestRevokedCredentialEndsStreams: a Sync stream and a WatchCluster
// stream opened with a credential end (Unauthenticated) once the
// credentials file is rewritten without it; deleting the file revokes
// every credential it held (REST answers 401), and the admin token still
// works.
func TestRevokedCredentialEndsStreams(t *testing.T) {
	creds := writeCredentials(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.AdminToken, c.Access.CredentialsFile = accessAdminToken, creds })
	defer stop(t, s)
	cc := dialAnon(t, s.GRPCAddr())
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok-track-all"), 60*time.Second)
	defer cancel()
	sync, err := api.NewRateLimitClient(cc).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sync.Send(syncReport([]string{"a"})); err != nil {
		t.Fatal(err)
	}
	watch, err := api.NewTrackerClient(cc).WatchCluster(ctx, &api.WatchClusterRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("first WatchCluster message: %v", err)
	}
	// Rewrite the file without track-all (a new file: the reload sees a change).
	old, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(old), "\n") {
		if !strings.HasPrefix(l, "track-all ") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(creds, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	ends := make(chan error, 2)
	go func() {
		for {
			if _, err := sync.Recv(); err != nil {
				ends <- fmt.Errorf("Sync: %w", err)
				return
			}
		}
	}()
	go func() {
		for {
			if _, err := watch.Recv(); err != nil {
				ends <- fmt.Errorf("WatchCluster: %w", err)
				return
			}
		}
	}()
	for range 2 {
		err := <-ends
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("stream of a revoked credential: %v, want Unauthenticated naming the revocation", err)
		}
	}

	// Deleting the file revokes what it held.
	meterA := func() int {
		code, _ := postRaw(t, s, "GET /v1/metering/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-read-all\r\nConnection: close\r\n\r\n")
		return code
	}
	if c := meterA(); c != http.StatusOK {
		t.Fatalf("read-all before the file is deleted: %d", c)
	}
	if err := os.Remove(creds); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted file's credentials refused", func() bool { return meterA() == http.StatusUnauthorized })
	if code, _ := get(t, s, "/v1/metering/status", "Authorization", "Bearer "+accessAdminToken); code != http.StatusOK {
		t.Fatalf("admin token after the file is deleted: %d", code)
	}
}

// TestMeteringMinors: an event 62 days ahead of the node's clock is
// refused naming timestamp (REST 400, gRPC InvalidArgument; it was
// accepted); QueryUsage with a group below -1 is InvalidArgument (it read
// every group); a page_token with a bad escape is a 400 naming it (it
// answered the first page).
func TestMeteringMinors(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), nil)
	defer stop(t, s)
	ts := time.Now().Add(62 * 24 * time.Hour).UnixMilli()
	ahead := fmt.Sprintf(`{"id":"ahead","timestamp":%d,"organization_id":"a","space_id":"s","consumer_id":"c","resource_id":"r","plan_id":"p","resource_instance_id":"i","measured_usage":[{"measure":"m","quantity":1}]}`, ts)
	code, body := postRaw(t, s, fmt.Sprintf("POST /v1/events/start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(ahead), ahead))
	if code != http.StatusBadRequest || !strings.Contains(body, "timestamp") {
		t.Errorf("event 62 days ahead over REST: %d %s, want 400 naming timestamp", code, body)
	}
	batch := `{"events":[{"kind":"start",` + ahead[1:] + `]}`
	code, body = postRaw(t, s, fmt.Sprintf("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(batch), batch))
	if code != http.StatusOK || !strings.Contains(body, `"status": 400`) || !strings.Contains(body, "timestamp") {
		t.Errorf("batch event 62 days ahead: %d %s, want its result 400 naming timestamp", code, body)
	}
	cc := dial(t, s.GRPCAddr())
	mc := api.NewMeteringClient(cc)
	ev := &api.MeterEvent{Id: "ahead-g", Timestamp: ts, Target: &api.MeterTarget{OrganizationId: "a", SpaceId: "s", ConsumerId: "c", ResourceId: "r", PlanId: "p", ResourceInstanceId: "i2"},
		MeasuredUsage: []*api.MeterMeasure{{Measure: "m", Quantity: 1}}}
	if _, err := mc.Start(adminCtx(t), ev); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "timestamp") {
		t.Errorf("gRPC event 62 days ahead: %v, want InvalidArgument naming timestamp", err)
	}
	if n := meteringSpans(s); n != 0 {
		t.Errorf("%d spans written from events 62 days ahead", n)
	}
	// An event a few seconds ahead (a client clock a little fast) is fine.
	ev.Timestamp, ev.Id = time.Now().Add(5*time.Second).UnixMilli(), "soon"
	if _, err := mc.Start(adminCtx(t), ev); err != nil {
		t.Errorf("event 5s ahead: %v", err)
	}

	for _, g := range []int32{-2, -100} {
		if _, err := mc.QueryUsage(adminCtx(t), &api.QueryUsageRequest{Group: g}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "group") {
			t.Errorf("QueryUsage group %d: %v, want InvalidArgument naming group", g, err)
		}
	}
	if _, err := mc.QueryUsage(adminCtx(t), &api.QueryUsageRequest{Group: -1}); err != nil {
		t.Errorf("QueryUsage group -1 (every group): %v", err)
	}

	for _, q := range []string{"/api/v1/tenants?page_token=%zz", "/api/v1/overview?page_token=%zz", "/api/v1/tenants?limit=%zz", "/v1/usage?organization_id=%zz", "/api/v1/sketches?top=%zz"} {
		if code, body := get(t, s, q); code != http.StatusBadRequest {
			t.Errorf("%s: %d %.200s, want 400", q, code, body)
		} else if p := strings.SplitN(q, "?", 2)[1]; !strings.Contains(body, strings.Split(p, "=")[0]) {
			t.Errorf("%s: %s, want the parameter named", q, body)
		}
	}
}
