package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// TestHostileInputREST: bad input to the metering REST API on a real node
// gets a 400 naming the field, never a record.
func TestHostileInputREST(t *testing.T) {
	c := startCluster(t, 1, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC).UnixMilli()
	c.setClock(now)
	base := "http://" + c.nodes[0].HTTPAddr()

	// Invalid UTF-8 in an id: encoding/json would store U+FFFD, so
	// "inst-\xff" and "inst-\xfe" would be one resource (the second a 409).
	for i, bad := range []string{"inst-\xff", "inst-\xfe"} {
		body := strings.Replace(doc("utf8-"+string(rune('a'+i)), now, "INST", true), "INST", bad, 1)
		code, out := postRetry(t, base+"/v1/events/start", "application/json", body)
		if code != http.StatusBadRequest || !strings.Contains(out, "UTF-8") {
			t.Errorf("start with resource_instance_id %q: %d %s, want 400 naming UTF-8", bad, code, out)
		}
	}
	batch := `{"events":[` + strings.Replace(doc("utf8-b", now, "INST", true), "{", `{"kind":"start",`, 1) + `]}`
	if code, out := postRetry(t, base+"/v1/events", "application/json", strings.Replace(batch, "INST", "inst-\xff", 1)); code != http.StatusBadRequest || !strings.Contains(out, "UTF-8") {
		t.Errorf("batch with invalid UTF-8: %d %s, want 400", code, out)
	}

	steps := []struct {
		name, path, body string
		want             int
		contains         []string
	}{
		{"array body", "/v1/events/start", `[{"id":"x"}]`, 400, []string{"body", "array"}},
		{"string body", "/v1/events/stop", `"x"`, 400, []string{"body", "string"}},
		{"array batch", "/v1/events", `[]`, 400, []string{"body", "array"}},
		{"negative quantity", "/v1/events/start", strings.Replace(doc("neg", now, "inst-neg", true), "512", "-1", 1), 400, []string{"measured_usage[0].quantity", "negative"}},
		{"clock array", "/v1/metering/clock", `[1]`, 400, []string{"body", "array"}},
		{"clock unknown field", "/v1/metering/clock", `{"advance":1}`, 400, []string{"advance", "unknown"}},
	}
	for _, st := range steps {
		code, out := postRetry(t, base+st.path, "application/json", st.body)
		ok := code == st.want
		for _, s := range st.contains {
			ok = ok && strings.Contains(out, s)
		}
		if !ok {
			t.Errorf("%s: %d %s, want %d containing %q", st.name, code, out, st.want, st.contains)
		}
	}

	gets := []struct {
		name, query string
		contains    []string
	}{
		{"usage to before from", "/v1/usage?from=2000&to=1000", []string{"to", "before"}},
		{"usage negative limit", "/v1/usage?limit=-5", []string{"limit", "negative"}},
		{"usage bad limit", "/v1/usage?limit=ten", []string{"limit"}},
		{"usage invalid UTF-8", "/v1/usage?organization_id=%ff", []string{"organization_id", "UTF-8"}},
		{"bill tenant with a space", "/v1/usage/bill?tenant=" + url.QueryEscape("a b") + "&from=1&to=2", []string{"tenant"}},
		{"bill tenant too long", "/v1/usage/bill?tenant=" + strings.Repeat("a", 200) + "&from=1&to=2", []string{"tenant"}},
		{"bill tenant invalid UTF-8", "/v1/usage/bill?tenant=%fe&from=1&to=2", []string{"tenant", "UTF-8"}},
	}
	for _, g := range gets {
		resp, err := http.Get(base + g.query)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ok := resp.StatusCode == http.StatusBadRequest
		for _, s := range g.contains {
			ok = ok && strings.Contains(string(b), s)
		}
		if !ok {
			t.Errorf("%s: %d %s, want 400 containing %q", g.name, resp.StatusCode, b, g.contains)
		}
	}
	// The refusals left no record behind.
	resp, err := http.Get(base + "/v1/usage")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), "inst-") {
		t.Fatalf("a refused event was recorded: %s", b)
	}
}

// TestHostileInputGRPC: the same rules over gRPC.
func TestHostileInputGRPC(t *testing.T) {
	c := startCluster(t, 1, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC).UnixMilli()
	c.setClock(now)
	cc, err := grpc.NewClient(c.nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	m := api.NewMeteringClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := &api.MeterEvent{Id: "neg", Timestamp: now, Target: &api.MeterTarget{OrganizationId: "o", SpaceId: "s", ConsumerId: "c", ResourceId: "r", PlanId: "p", ResourceInstanceId: "i"},
		MeasuredUsage: []*api.MeterMeasure{{Measure: "memory", Quantity: -3}}}
	if _, err := m.Start(ctx, ev); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "quantity") {
		t.Errorf("negative quantity over gRPC: %v, want InvalidArgument naming quantity", err)
	}
	if _, err := m.QueryUsage(ctx, &api.QueryUsageRequest{Group: -1, From: 2000, To: 1000}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("QueryUsage to < from: %v, want InvalidArgument", err)
	}
}

// FuzzMeteringREST sends any body to every metering endpoint that reads
// JSON (POST /v1/events/start, /stop, /v1/events, /v1/metering/clock) and
// any query to the ones that read parameters (GET /v1/usage,
// /v1/usage/bill; /v1/metering/status and /dead-letters, which read
// nothing, with the query too) of one real node: the answer is never a 5xx
// other than 503/504 (no leader, deadline), always JSON, and a body that is
// not valid UTF-8 is always refused with 400.
func FuzzMeteringREST(f *testing.F) {
	c := startCluster(f, 1, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC).UnixMilli()
	c.setClock(now)
	base := "http://" + c.nodes[0].HTTPAddr()
	f.Add(uint8(0), []byte(doc("f1", now, "i1", true)), "")
	f.Add(uint8(1), []byte(doc("f2", now+1000, "i1", false)), "")
	f.Add(uint8(2), []byte(`{"events":[{"kind":"start","id":"b"}]}`), "")
	f.Add(uint8(3), []byte(`{"advance_ms":1}`), "")
	f.Add(uint8(0), []byte("{\"id\":\"\xff\"}"), "")
	f.Add(uint8(4), []byte(nil), "from=1&to=0&limit=-1")
	f.Add(uint8(5), []byte(nil), "tenant=a%20b&from=1&to=2")
	posts := []string{"/v1/events/start", "/v1/events/stop", "/v1/events", "/v1/metering/clock"}
	gets := []string{"/v1/usage", "/v1/usage/bill", "/v1/metering/status", "/v1/metering/dead-letters"}
	client := &http.Client{Timeout: 30 * time.Second}
	f.Fuzz(func(t *testing.T, which uint8, body []byte, query string) {
		var resp *http.Response
		var err error
		if i := int(which) % (len(posts) + len(gets)); i < len(posts) {
			resp, err = client.Post(base+posts[i], "application/json", strings.NewReader(string(body)))
		} else {
			u, perr := url.Parse(base + gets[i-len(posts)])
			if perr != nil {
				t.Fatal(perr)
			}
			// Re-encoded, so every parameter (with any bytes) reaches the
			// handler instead of net/http refusing the request line.
			vals, perr := url.ParseQuery(query)
			if perr != nil {
				t.Skip("not a query string:", perr)
			}
			u.RawQuery = vals.Encode()
			resp, err = client.Get(u.String())
		}
		if err != nil {
			t.Skip("request not sendable:", err) // e.g. a query net/http refuses to send
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code := resp.StatusCode
		if code >= 500 && code != http.StatusServiceUnavailable && code != http.StatusGatewayTimeout {
			t.Fatalf("%d %s", code, out)
		}
		if !json.Valid(out) {
			t.Fatalf("%d: answer is not JSON: %q", code, out)
		}
		if int(which)%(len(posts)+len(gets)) < len(posts) && !utf8.Valid(body) && code != http.StatusBadRequest && code != http.StatusUnsupportedMediaType {
			t.Fatalf("invalid UTF-8 body answered %d %s", code, out)
		}
	})
}
