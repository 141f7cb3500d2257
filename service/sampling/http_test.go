package sampling

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	p := tuned()
	p.MaxSources = 1
	c := New(p)
	now := t0
	srv := httptest.NewServer(NewHandler(c, func() time.Time { return now }))
	defer srv.Close()

	post := func(ct, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+BacklogPath, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("response is not JSON: %v", err)
		}
		return resp.StatusCode, out
	}

	code, out := post("application/json", `{"kind":"locate","backlog":7000,"source":"q1"}`)
	if code != http.StatusOK || out["kind"] != "locate" || out["enabled"] != true || out["target_backlog"] != 5000.0 {
		t.Fatalf("good report: %d %v", code, out)
	}
	if res, _ := c.Tick(now); res.Input != 7000 {
		t.Fatalf("controller input %v after the report, want 7000", res.Input)
	}
	// No Content-Type is accepted (curl -d sends form type, so that one is not).
	if code, out := post("", `{"kind":"locate","backlog":0,"source":"q1"}`); code != http.StatusOK {
		t.Fatalf("no Content-Type: %d %v", code, out)
	}

	for _, c := range []struct {
		name, ct, body string
		code           int
		msg            string
	}{
		{"form type", "application/x-www-form-urlencoded", `{"kind":"locate","backlog":1}`, 415, "application/json"},
		{"malformed", "application/json", `{"kind":"locate","backlog":`, 400, "malformed JSON"},
		{"unknown field", "application/json", `{"kind":"locate","backlog":1,"queue":2}`, 400, "unknown field"},
		{"string backlog", "application/json", `{"kind":"locate","backlog":"12"}`, 400, "field backlog: expected a number"},
		{"missing kind", "application/json", `{"backlog":12}`, 400, `"kind" is required`},
		{"missing backlog", "application/json", `{"kind":"locate"}`, 400, `"backlog" is required`},
		{"negative", "application/json", `{"kind":"locate","backlog":-3}`, 400, "finite number ≥ 0"},
		{"overflow", "application/json", `{"kind":"locate","backlog":1e999}`, 400, "field backlog"},
		{"array", "application/json", `[{"kind":"locate","backlog":1}]`, 400, "field body: want a JSON object, got an array"},
		{"invalid UTF-8", "application/json", "{\"kind\":\"locate\",\"backlog\":1,\"source\":\"q\xff\"}", 400, "not valid UTF-8"},
		{"two objects", "application/json", `{"kind":"locate","backlog":1}{"kind":"locate","backlog":2}`, 400, "one JSON object"},
		{"unknown kind", "application/json", `{"kind":"submit","backlog":1}`, 422, `"submit"`},
		{"too many sources", "application/json", `{"kind":"locate","backlog":1,"source":"q2"}`, 429, "max_sources"},
		{"too big", "application/json", `{"kind":"locate","backlog":1,"source":"` + strings.Repeat("x", 5000) + `"}`, 413, "over 4096 bytes"},
	} {
		code, out := post(c.ct, c.body)
		msg, _ := out["error"].(string)
		if code != c.code || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %q, want %d naming %q", c.name, code, msg, c.code, c.msg)
		}
	}

	resp, err := http.Get(srv.URL + BacklogPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if st := c.Status(); st.Reports != 2 || st.Rejected != 3 {
		t.Fatalf("reports %d rejected %d, want 2 and 3 (negative, unknown kind, too many sources)", st.Reports, st.Rejected)
	}
}

type unreachable struct{}

func (unreachable) ReportBacklog(string, string, float64, time.Time) (Status, error) {
	return Status{}, fmt.Errorf("no owner: %w", ErrUnavailable)
}

func TestHandlerUnavailable(t *testing.T) {
	srv := httptest.NewServer(NewHandler(unreachable{}, nil))
	defer srv.Close()
	resp, err := http.Post(srv.URL+BacklogPath, "application/json", strings.NewReader(`{"kind":"locate","backlog":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
