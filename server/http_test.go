package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/version"
)

// get fetches path from s's HTTP address with optional headers (name, value, …).
func get(t *testing.T, s *Server, path string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+s.HTTPAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestHTTPDebugEndpointsOffByDefault(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.AdminToken = "s3cret" })
	defer stop(t, s)
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
		if code, _ := get(t, s, p, "Authorization", "Bearer s3cret"); code != http.StatusNotFound {
			t.Errorf("GET %s with debug endpoints off: %d, want 404", p, code)
		}
	}
}

func TestHTTPDebugEndpointsNeedAdminToken(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.AdminToken = "s3cret"; c.Access.EnableDebugEndpoints = true })
	defer stop(t, s)
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
		if code, _ := get(t, s, p); code != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d, want 401", p, code)
		}
		if code, _ := get(t, s, p, "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", p, code)
		}
		if code, body := get(t, s, p, "Authorization", "Bearer s3cret"); code != http.StatusOK {
			t.Errorf("GET %s with the token: %d, want 200 (%.200s)", p, code, body)
		}
	}
}

// Without a token the admin rule is "loopback only"; a remote address cannot be
// produced over real loopback HTTP, so the rule is checked on the handler too.
func TestHTTPDebugEndpointsLoopbackOnlyWithoutToken(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), func(c *Config) { c.Access.EnableDebugEndpoints = true })
	defer stop(t, s)
	if code, body := get(t, s, "/debug/pprof/"); code != http.StatusOK {
		t.Fatalf("loopback GET without a configured token: %d (%.200s)", code, body)
	}
	ok := s.requireAdmin(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for addr, want := range map[string]int{"10.1.2.3:5555": http.StatusForbidden, "[::1]:5555": http.StatusOK, "127.0.0.1:5555": http.StatusOK} {
		req := httptest.NewRequest("GET", "/debug/pprof/", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		ok.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("peer %s: %d, want %d", addr, rec.Code, want)
		}
	}
}

func TestMetricsBuildInfoAndAppliedIndexGauge(t *testing.T) {
	s, c := startServer(t, t.TempDir(), nil)
	defer stop(t, s)
	track(t, c, "t1", 0, hashesIn(1, 0, 3))
	code, body := get(t, s, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if !strings.Contains(body, "# TYPE tollgate_raft_applied_index gauge\n") {
		t.Errorf("tollgate_raft_applied_index is not typed gauge:\n%s", grepLines(body, "tollgate_raft_applied_index"))
	}
	m := regexp.MustCompile(`(?m)^tollgate_raft_applied_index\{group="0"\} (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no applied index for group 0:\n%s", grepLines(body, "tollgate_raft_applied_index"))
	}
	if n, _ := strconv.ParseUint(m[1], 10, 64); n == 0 || n > s.FSM(0).AppliedIndex() {
		t.Errorf("group 0 applied index %s, FSM says %d", m[1], s.FSM(0).AppliedIndex())
	}
	// The term counts elections: a single node elected itself at least once.
	m = regexp.MustCompile(`(?m)^tollgate_raft_term\{group="0"\} (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no raft term for group 0:\n%s", grepLines(body, "tollgate_raft_term"))
	}
	if n, _ := strconv.ParseUint(m[1], 10, 64); n == 0 {
		t.Errorf("group 0 raft term %s, want ≥ 1 (the node elected itself)", m[1])
	}
	if !strings.Contains(body, "# TYPE tollgate_build_info gauge\n") {
		t.Errorf("tollgate_build_info missing or not a gauge:\n%s", grepLines(body, "tollgate_build_info"))
	}
	bi := version.Get()
	m = regexp.MustCompile(`(?m)^tollgate_build_info\{goversion="([^"]*)",revision="([^"]*)",version="([^"]*)"\} 1$`).FindStringSubmatch(body)
	if m == nil || m[1] != bi.GoVersion || !strings.HasPrefix(m[2], bi.Revision) || m[3] != bi.Version {
		t.Errorf("build info %q, want labels of %+v:\n%s", m, bi, grepLines(body, "tollgate_build_info"))
	}
}

func grepLines(body, sub string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHTTPTenantUnknownIdleAndList(t *testing.T) {
	dir := t.TempDir()
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte("tenants:\n  configured:\n    max_series: 640\n  free:\n    unlimited: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := newTestClock()
	s, c := startServer(t, filepath.Join(dir, "data"), func(c *Config) {
		c.Clock.Now = clk.Now
		c.Tracking.IdleTimeout = time.Minute
		c.Limits.File = limits
	})
	defer stop(t, s)
	track(t, c, "zeta", 0, hashesIn(1, 0, 4))
	track(t, c, "idle", 0, hashesIn(2, 0, 2))
	track(t, c, "free", 1, hashesIn(3, 1, 5))

	// Unknown: 404 with a JSON reason naming the tenant.
	code, body := get(t, s, "/api/v1/tenants/nobody")
	var e struct{ Error string }
	if code != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, `"nobody"`) {
		t.Fatalf("unknown tenant: %d %s", code, body)
	}
	// Known with series: 200.
	code, body = get(t, s, "/api/v1/tenants/zeta")
	var u TenantUsage
	if code != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil || u.Series != 4 || u.MaxSeries != 64 {
		t.Fatalf("zeta: %d %s", code, body)
	}
	// Known from the limits file only: 200 with 0 series.
	code, body = get(t, s, "/api/v1/tenants/configured")
	if code != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil || u.Series != 0 || u.MaxSeries != 640 {
		t.Fatalf("configured: %d %s", code, body)
	}
	// Idle: every series expired, still known, 200 with 0 series.
	clk.Advance(3 * time.Minute)
	track(t, c, "zeta", 0, hashesIn(1, 0, 4)) // keeps zeta and free active
	track(t, c, "free", 1, hashesIn(3, 1, 5))
	waitFor(t, "idle series expired", func() bool { return s.FSM(0).TenantActive("idle") == 0 })
	code, body = get(t, s, "/api/v1/tenants/idle")
	if code != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil || u.Series != 0 || u.Tenant != "idle" {
		t.Fatalf("idle tenant: %d %s", code, body)
	}
	// Bad id: 400 with a JSON reason.
	if code, body = get(t, s, "/api/v1/tenants/a*b%2Fc"); code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
		t.Fatalf("bad tenant id: %d %s", code, body)
	}

	code, body = get(t, s, "/api/v1/tenants")
	var list TenantList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("tenant list: %d %s", code, body)
	}
	type row struct {
		name     string
		series   int64
		max      int64
		fraction float64 // -1: null (unlimited)
	}
	want := []row{{"configured", 0, 640, 0}, {"free", 5, 0, -1}, {"idle", 0, 64, 0}, {"zeta", 4, 64, 4.0 / 64}}
	if len(list.Tenants) != len(want) {
		t.Fatalf("tenant list: %s", body)
	}
	for i, w := range want {
		g := list.Tenants[i]
		frac := -1.0
		if g.FractionOfLimit != nil {
			frac = *g.FractionOfLimit
		}
		if g.Tenant != w.name || g.Series != w.series || g.MaxSeries != w.max || frac != w.fraction {
			t.Errorf("row %d: %+v (fraction %v), want %+v", i, g, frac, w)
		}
	}
}

func TestHTTPIndexLinksEndpoints(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), nil)
	defer stop(t, s)
	code, body := get(t, s, "/")
	if code != http.StatusOK {
		t.Fatalf("/: %d", code)
	}
	for _, link := range []string{`href="/api/v1/status"`, `href="/api/v1/tenants"`, `href="/metrics"`, `href="/readyz"`, `href="/healthz"`} {
		if !strings.Contains(body, link) {
			t.Errorf("index lacks %s:\n%s", link, body)
		}
	}
	if strings.Contains(body, "/debug/pprof") {
		t.Errorf("index links debug endpoints that are off")
	}
	// Only "/" itself: other paths are still 404, not the index.
	if code, _ := get(t, s, "/no-such-page"); code != http.StatusNotFound {
		t.Errorf("/no-such-page: %d, want 404", code)
	}
}
