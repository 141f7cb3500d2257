package observability

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"

	"github.com/tollgate-io/tollgate/gateway"
)

// gatewayPerTenant are the gateway metrics labelled by tenant: they have no
// series before a tenant's first request.
var gatewayPerTenant = map[string]bool{
	"tollgate_gateway_series_total": true, "tollgate_gateway_samples_total": true,
	"tollgate_gateway_forwarded_samples_total": true, "tollgate_gateway_invalid_requests_total": true,
	"tollgate_gateway_fail_open_total": true,
}

var gatewayScrape struct {
	once sync.Once
	fams map[string]*dto.MetricFamily
	err  error
}

// scrapeGateway gathers the metrics of a gateway that has served nothing
// yet (its tracker is never called; its upstream is a loopback server).
func scrapeGateway(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	gatewayScrape.once.Do(func() {
		up := httptest.NewServer(nil)
		defer up.Close()
		reg := prometheus.NewRegistry()
		_, err := gateway.New(gateway.Config{Upstream: up.URL + "/api/v1/write", Tracker: noTracker{}, Registerer: reg,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			gatewayScrape.err = err
			return
		}
		mfs, err := reg.Gather()
		if err != nil {
			gatewayScrape.err = err
			return
		}
		gatewayScrape.fams = map[string]*dto.MetricFamily{}
		for _, f := range mfs {
			if len(f.GetMetric()) > 0 {
				gatewayScrape.fams[f.GetName()] = f
			}
		}
	})
	if gatewayScrape.err != nil {
		t.Fatal(gatewayScrape.err)
	}
	return gatewayScrape.fams
}

type noTracker struct{}

func (noTracker) TrackSeries(context.Context, string, []uint64) ([]uint64, error) { return nil, nil }

// TestGatewayAlertRules: the gateway's rules load, each has a severity, a
// summary and a runbook heading in docs/alerts.md, every metric they name
// is exported by a gateway from its start (or is per tenant), and their
// promtool unit test passes (each alert fires on its condition and stays
// silent otherwise) where promtool is installed.
func TestGatewayAlertRules(t *testing.T) {
	rgs, errs := rulefmt.ParseFile("gateway-alerts.yaml", false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if rgs == nil {
		t.FailNow()
	}
	alertsMD := anchors(t, "../../docs/alerts.md")
	used := map[string]string{}
	var names []string
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			ms, err := metricNames(t, r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			}
			for _, m := range ms {
				if !strings.HasPrefix(m, "tollgate_gateway_") {
					t.Errorf("alert %s names %s, not a gateway metric", r.Alert, m)
				}
				used[m] = "alert " + r.Alert
			}
			if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
				t.Errorf("alert %s: severity %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("alert %s: no summary", r.Alert)
			}
			anchor := strings.ToLower(r.Alert)
			if want := runbookBase + "docs/alerts.md#" + anchor; r.Annotations["runbook_url"] != want || !slices.Contains(alertsMD, anchor) {
				t.Errorf("alert %s: runbook_url %q, want %q with that heading in docs/alerts.md", r.Alert, r.Annotations["runbook_url"], want)
			}
		}
	}
	if len(names) < 3 {
		t.Fatalf("gateway alerts: %v", names)
	}
	tests, err := os.ReadFile("gateway-alerts.test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range names {
		if !strings.Contains(string(tests), "alertname: "+a) {
			t.Errorf("alert %s has no promtool test in gateway-alerts.test.yaml", a)
		}
	}
	checkExported(t, used)

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian: apt-get install prometheus): the rules' unit test did not run")
	}
	out, err := exec.Command(promtool, "test", "rules", "gateway-alerts.test.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules gateway-alerts.test.yaml: %v\n%s", err, out)
	}
}
