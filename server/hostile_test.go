package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// TestSaturatedSketchRefused: a push with every register at its maximum
// (no finite estimate) is refused with InvalidArgument, and the status
// pages that show estimates keep answering valid JSON.
func TestSaturatedSketchRefused(t *testing.T) {
	limits := writeSketchLimits(t)
	tc := startCluster(t, 1, func(_ int, c *Config) { c.Node.HTTPAddr = "127.0.0.1:0"; c.Limits.File = limits })
	s := tc.nodes[0]
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const p = 11
	full := make([]byte, 1<<p)
	for i := range full {
		full[i] = api.HLLMaxValue(p)
	}
	now := time.Now().Unix() / 60
	_, err = api.NewSketchesClient(cc).PushSketches(ctx, &api.PushSketchesRequest{Precision: p,
		Sketches: []*api.Sketch{{Tenant: "t1", Partition: 1, Minute: now, Dense: full}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "saturated") {
		t.Fatalf("saturated push: %v, want InvalidArgument naming saturation", err)
	}
	for _, path := range []string{"/api/v1/status", "/api/v1/sketches", "/api/v1/sketches?top=100"} {
		code, body := get(t, s, path, "Authorization", "Bearer "+testToken)
		if code != http.StatusOK || !json.Valid([]byte(body)) || len(body) == 0 {
			t.Errorf("%s after a saturated push: %d %q", path, code, body)
		}
	}
}

// TestTenantListPages: /api/v1/tenants answers pages (default 1000, limit
// and page_token), whose concatenation is every tenant once, in order;
// bad paging parameters are 400s naming them.
func TestTenantListPages(t *testing.T) {
	const n = 2345
	var b strings.Builder
	b.WriteString("tenants:\n")
	for i := range n {
		fmt.Fprintf(&b, "  t%05d:\n    max_series: 10\n", i)
	}
	lf := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(lf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s, c := startServer(t, t.TempDir(), func(cfg *Config) { cfg.Limits.File = lf })
	defer stop(t, s)

	var page TenantList
	code, body := get(t, s, "/api/v1/tenants")
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Tenants) != defaultTenantPage || page.Total != n || page.NextPageToken == "" {
		t.Fatalf("first page: %d, %d rows, total %d, next %q", code, len(page.Tenants), page.Total, page.NextPageToken)
	}
	var seen []string
	token := ""
	for range 10 {
		code, body := get(t, s, "/api/v1/tenants?limit=700&page_token="+token)
		page = TenantList{}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("page after %q: %d %s", token, code, body)
		}
		for _, r := range page.Tenants {
			seen = append(seen, r.Tenant)
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if len(seen) != n {
		t.Fatalf("pages hold %d tenants, want %d", len(seen), n)
	}
	for i, name := range seen {
		if want := fmt.Sprintf("t%05d", i); name != want {
			t.Fatalf("row %d: %s, want %s", i, name, want)
		}
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=10001", "limit=x", "page_token=%25%25", "page_token=%ff"} {
		if code, body := get(t, s, "/api/v1/tenants?"+q); code != http.StatusBadRequest || !strings.Contains(body, strings.Split(q, "=")[0]) {
			t.Errorf("?%s: %d %s, want 400 naming the parameter", q, code, body)
		}
	}

	// The overview's tenants (those with series, most used first) page the
	// same way.
	// Tenant i gets i+1 series, one per group in turn, so no group's share
	// of its limit of 10 (2 or 3 per group) binds: with all of them in one
	// group, the third series waited on a headroom move and, refused under
	// load (-race, CI), left t00002 tied with t00001.
	for i := range 5 {
		for j := range i + 1 {
			part := j % 4 * 16 // partitions 0, 16, 32, 48: groups 0..3
			if rej := track(t, c, fmt.Sprintf("t%05d", i), part, hashesIn(uint64(10*i+j+1), part, 1)); len(rej) != 0 {
				t.Fatalf("t%05d: series %d refused", i, j)
			}
		}
	}
	var ov Overview
	var names []string
	token = ""
	for range 5 {
		code, body := get(t, s, "/api/v1/overview?limit=2&page_token="+token)
		ov = Overview{}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &ov) != nil || len(ov.Tenants) > 2 || ov.TenantsTotal != 5 {
			t.Fatalf("overview page %q: %d %.300s", token, code, body)
		}
		for _, r := range ov.Tenants {
			names = append(names, r.Tenant)
		}
		if token = ov.NextPageToken; token == "" {
			break
		}
	}
	if strings.Join(names, ",") != "t00004,t00003,t00002,t00001,t00000" {
		t.Fatalf("overview pages: %v", names)
	}
	if code, body := get(t, s, "/api/v1/overview?limit=-3"); code != http.StatusBadRequest || !strings.Contains(body, "limit") {
		t.Fatalf("overview limit=-3: %d %s", code, body)
	}
}

// FuzzNodeREST sends any path suffix, query and body to the JSON
// endpoints of one real node (/api/v1/status, /api/v1/tenants and
// /api/v1/tenants/{t}, /api/v1/overview, /api/v1/sketches, and POST
// /api/v1/backlog): never a 5xx other than 503, always JSON.
func FuzzNodeREST(f *testing.F) {
	cfg := Config{
		Node:     NodeConfig{ID: "n1", DataDir: f.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster:  ClusterConfig{Bootstrap: true},
		Raft:     RaftConfig{Addr: "127.0.0.1:0"},
		Tracking: TrackingConfig{DefaultMaxSeries: 64},
		Logger:   slog.New(slog.DiscardHandler),
	}
	s, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), "", "", []byte(nil))
	f.Add(uint8(1), "", "limit=2&page_token=YQ", []byte(nil))
	f.Add(uint8(2), "t1", "", []byte(nil))
	f.Add(uint8(3), "", "limit=-1", []byte(nil))
	f.Add(uint8(4), "", "top=0", []byte(nil))
	f.Add(uint8(5), "", "", []byte(`{"kind":"locate","backlog":1}`))
	f.Add(uint8(5), "", "", []byte("[\xff]"))
	client := &http.Client{Timeout: 30 * time.Second}
	base := "http://" + s.HTTPAddr()
	f.Fuzz(func(t *testing.T, which uint8, tenant, query string, body []byte) {
		vals, err := url.ParseQuery(query)
		if err != nil {
			t.Skip("not a query string")
		}
		q := "?" + vals.Encode()
		var resp *http.Response
		switch which % 6 {
		case 0:
			resp, err = client.Get(base + "/api/v1/status" + q)
		case 1:
			resp, err = client.Get(base + "/api/v1/tenants" + q)
		case 2:
			if tenant == "" {
				t.Skip("empty tenant is the list")
			}
			resp, err = client.Get(base + "/api/v1/tenants/" + url.PathEscape(tenant) + q)
		case 3:
			resp, err = client.Get(base + "/api/v1/overview" + q)
		case 4:
			resp, err = client.Get(base + "/api/v1/sketches" + q)
		case 5:
			resp, err = client.Post(base+"/api/v1/backlog", "application/json", strings.NewReader(string(body)))
		}
		if err != nil {
			t.Skip("not sendable:", err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if resp.StatusCode != http.StatusMovedPermanently && !json.Valid(out) {
			t.Fatalf("%d: not JSON: %q", resp.StatusCode, out)
		}
	})
}
