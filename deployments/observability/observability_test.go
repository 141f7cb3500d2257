package observability

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// runbookBase is where every alert's runbook_url points: a heading of
// docs/operations.md (the procedures) or docs/alerts.md (the rest).
const runbookBase = "https://github.com/tollgate-io/tollgate/blob/main/"

// operationsAnchors are the procedures of docs/operations.md the alerts link
// to. When that file is in the tree, its headings are checked too.
var operationsAnchors = []string{
	"replace-a-node-that-lost-its-disk",
	"recover-a-group-that-lost-quorum",
	"add-a-node",
	"remove-a-node",
	"rotate-certificates-and-gossip-keys",
}

// What the alert rules must cover, each by at least one alert whose expression
// names the metric.
var requiredAlerts = map[string]string{
	"no leader":            "tollgate_group_has_leader",
	"halted replica":       "tollgate_group_halted",
	"voter not running":    "tollgate_group_voters_not_alive",
	"not ready":            "tollgate_ready",
	"disk full":            "tollgate_data_dir_filesystem_avail_bytes",
	"sink dead letters":    "tollgate_metering_dead_letters_total",
	"rejection spikes":     "tollgate_series_rejected_total",
	"config reconcile lag": "tollgate_config_replica_version",
	"certificate expiry":   "tollgate_tls_certificate_expiry_timestamp_seconds",
	"all nodes down":       "tollgate_ready", // absent(tollgate_ready)
	"replica down":         "tollgate_group_replica_down",
	"disk not writable":    "tollgate_disk_writable",
}

var promql = parser.NewParser(parser.Options{})

// metricNames returns every metric an expression selects by name.
func metricNames(t *testing.T, expr string) ([]string, error) {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				if m.Type != labels.MatchEqual {
					bad = fmt.Errorf("selector %s matches metric names by regexp: name them", vs)
				}
				name = m.Value
			}
		}
		names = append(names, name)
		return nil
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("names no metric")
	}
	return names, bad
}

func TestAlertRules(t *testing.T) {
	rgs, errs := rulefmt.ParseFile("alerts.yaml", false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if rgs == nil {
		t.FailNow()
	}
	alertsMD := anchors(t, "../../docs/alerts.md")
	ops := slices.Clone(operationsAnchors)
	if _, err := os.Stat("../../docs/operations.md"); err == nil {
		have := anchors(t, "../../docs/operations.md")
		for _, a := range ops {
			if !slices.Contains(have, a) {
				t.Errorf("docs/operations.md has no heading for #%s", a)
			}
		}
	}
	covered := map[string]bool{}
	used := map[string]string{}
	n := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			names, err := metricNames(t, r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			}
			for _, m := range names {
				used[m] = "alert " + r.Alert
				for what, metric := range requiredAlerts {
					if m == metric {
						covered[what] = true
					}
				}
			}
			if r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("alert %s: no summary", r.Alert)
			}
			url := r.Annotations["runbook_url"]
			doc, anchor, ok := strings.Cut(strings.TrimPrefix(url, runbookBase), "#")
			switch {
			case !strings.HasPrefix(url, runbookBase) || !ok:
				t.Errorf("alert %s: runbook_url %q is not %sdocs/…#anchor", r.Alert, url, runbookBase)
			case doc == "docs/operations.md" && !slices.Contains(ops, anchor):
				t.Errorf("alert %s: runbook_url %q: docs/operations.md has no procedure %q", r.Alert, url, anchor)
			case doc == "docs/alerts.md" && !slices.Contains(alertsMD, anchor):
				t.Errorf("alert %s: runbook_url %q: docs/alerts.md has no heading for it", r.Alert, url)
			case doc != "docs/operations.md" && doc != "docs/alerts.md":
				t.Errorf("alert %s: runbook_url %q: want docs/operations.md or docs/alerts.md", r.Alert, url)
			}
		}
	}
	for what := range requiredAlerts {
		if !covered[what] {
			t.Errorf("no alert for %q (on %s)", what, requiredAlerts[what])
		}
	}
	if n == 0 {
		t.Fatal("no alerts")
	}
	checkExported(t, used)
}

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		h = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(h, "")
		out = append(out, strings.ReplaceAll(h, " ", "-"))
	}
	return out
}

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// grafanaVars are the dashboard's variables as Grafana substitutes them
// before a query reaches Prometheus.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "30s", "${job}", "tollgate", "$job", "tollgate")

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("tollgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" {
		t.Error("dashboard needs a title and a uid")
	}
	used := map[string]string{}
	ids := map[int]bool{}
	var walk func([]panel)
	exprs := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs++
				if strings.Contains(grafanaVars.Replace(tg.Expr), "$") {
					t.Errorf("panel %q %s: a variable the dashboard does not define: %s", p.Title, tg.RefID, tg.Expr)
				}
				names, err := metricNames(t, grafanaVars.Replace(tg.Expr))
				if err != nil {
					t.Errorf("panel %q %s: %v\n  %s", p.Title, tg.RefID, err, tg.Expr)
				}
				for _, m := range names {
					used[m] = fmt.Sprintf("panel %q", p.Title)
				}
			}
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil {
			t.Errorf("variable %s: query %v is not label_values(metric, label)", v.Name, v.Query)
			continue
		}
		used[m[1]] = "variable " + v.Name
	}
	// The sections the dashboard must have, by a metric each shows.
	for what, metric := range map[string]string{
		"cluster health": "tollgate_ready", "leaders": "tollgate_group_leader", "applied index": "tollgate_raft_applied_index",
		"tracking throughput": "tollgate_series_created_total", "rejections by cause": "tollgate_share_rejections_total",
		"near-limit tenants": "tollgate_tenants_near_limit", "share moves": "tollgate_share_moved_series_total",
		"rate-limit admitted vs limit": "tollgate_ratelimit_owner_limited_admitted_per_second",
		"sketch hub":                   "tollgate_sketches_held", "metering backlog": "tollgate_metering_lag_seconds",
		"sink errors": "tollgate_metering_sink_responses_total", "clock offsets": "tollgate_clock_offset_seconds",
		"nodes out of clock bound":   "tollgate_clock_in_bound",
		"Envoy decisions":            "tollgate_envoy_ratelimit_requests_total",
		"Envoy descriptor decisions": "tollgate_envoy_ratelimit_descriptor_decisions_total",
		"memory":                     "process_resident_memory_bytes", "heap": "go_memstats_heap_inuse_bytes",
		"GC pauses": "go_gc_duration_seconds",
	} {
		if used[metric] == "" {
			t.Errorf("dashboard shows no %s (%s)", what, metric)
		}
	}
	t.Logf("%d panels, %d queries, %d metrics", len(ids), exprs, len(used))
	checkExported(t, used)
}

// node is one real node shared by the tests: started on first use.
var node struct {
	families map[string]*dto.MetricFamily
	err      error
}

// labelledByTraffic are metrics every series of which is labelled with a
// value only traffic brings (an Envoy domain is known once Envoy calls with
// it): no node can export them from its start. Panels may show them; alerts
// may not rely on them.
var labelledByTraffic = map[string]string{
	"tollgate_envoy_ratelimit_requests_total":             "labelled by the domain Envoy sends",
	"tollgate_envoy_ratelimit_descriptor_decisions_total": "labelled by the domain and rule Envoy's descriptors match",
}

// checkExported fails for every metric named that a freshly started node does
// not export: an operator's panel or alert must not wait for an event to have
// data ("no data" reads as broken, and absent series defeat "== 0" alerts).
func checkExported(t *testing.T, used map[string]string) {
	t.Helper()
	fams := scrapeNode(t)
	var missing []string
	for m, where := range used {
		fams := fams
		if strings.HasPrefix(m, "tollgate_gateway_") {
			// The remote-write gateway's own metrics, from a gateway
			// (gateway_test.go); per-tenant ones appear with a tenant's
			// first request, which is when their panels have something to
			// show.
			if gatewayPerTenant[m] {
				continue
			}
			fams = scrapeGateway(t)
		}
		if _, ok := fams[m]; ok {
			continue
		}
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if f, ok := fams[base]; ok && base != m && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
			continue
		}
		if why := labelledByTraffic[m]; why != "" && !strings.HasPrefix(where, "alert ") {
			continue // a panel may wait for them; an alert may not
		}
		missing = append(missing, fmt.Sprintf("%s (%s)", m, where))
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not exported by a node from its start: %s", m)
	}
}

func scrapeNode(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	if node.families != nil || node.err != nil {
		if node.err != nil {
			t.Fatal(node.err)
		}
		return node.families
	}
	node.families, node.err = startAndScrape(t)
	if node.err != nil {
		t.Fatal(node.err)
	}
	return node.families
}

// startAndScrape starts a real single-node cluster (raft on disk, gRPC and
// HTTP on loopback) with TLS everywhere, as a production node runs, waits
// until it is ready and reads its /metrics over HTTPS.
func startAndScrape(t *testing.T) (map[string]*dto.MetricFamily, error) {
	dir, err := os.MkdirTemp("", "tollgate-observability-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pki, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: filepath.Join(dir, "pki"), Nodes: []string{"dev"}})
	if err != nil {
		return nil, err
	}
	cert, key := pki.Nodes["dev"][0], pki.Nodes["dev"][1]
	var tc server.TLSConfig
	if tc.GRPC, err = tlsutil.ServerConfig(cert, key, pki.CA, "none"); err != nil {
		return nil, err
	}
	if tc.HTTP, err = tlsutil.ServerConfig(cert, key, pki.CA, "none"); err != nil {
		return nil, err
	}
	if tc.Peer, err = tlsutil.ClientConfig(cert, key, pki.CA, ""); err != nil {
		return nil, err
	}
	if tc.RaftServer, tc.RaftClient, err = tlsutil.PeerConfigs(cert, key, pki.CA); err != nil {
		return nil, err
	}
	s, err := server.New(server.Config{
		Node: server.NodeConfig{
			ID:       "dev",
			DataDir:  filepath.Join(dir, "data"),
			GRPCAddr: "127.0.0.1:0",
			HTTPAddr: "127.0.0.1:0",
		},
		Cluster:  server.ClusterConfig{Bootstrap: true},
		Raft:     server.RaftConfig{Addr: "127.0.0.1:0"},
		Tracking: server.TrackingConfig{DefaultMaxSeries: 150_000},
		Access:   server.AccessConfig{TLS: tc},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	defer s.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		return nil, err
	}
	client, err := tlsutil.ClientConfig("", "", pki.CA, "")
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: client}}
	resp, err := hc.Get(s.HTTPScheme() + "://" + s.HTTPAddr() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("/metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("/metrics does not parse: %w", err)
	}
	for name, f := range fams {
		if len(f.GetMetric()) == 0 {
			delete(fams, name) // described but without a sample: not exported
		}
	}
	// The certificate expiry is the node certificate's NotAfter, per use.
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	want := float64(pair.Leaf.NotAfter.Unix())
	uses := map[string]bool{}
	for _, m := range fams["tollgate_tls_certificate_expiry_timestamp_seconds"].GetMetric() {
		if m.GetGauge().GetValue() != want {
			return nil, fmt.Errorf("certificate expiry %v, want %v (NotAfter)", m.GetGauge().GetValue(), want)
		}
		for _, l := range m.GetLabel() {
			uses[l.GetValue()] = true
		}
	}
	if len(uses) != 3 || !uses["grpc"] || !uses["http"] || !uses["raft"] {
		return nil, fmt.Errorf("certificate expiry exported for %v, want grpc, http and raft", uses)
	}
	return fams, nil
}
