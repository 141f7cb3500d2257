package sampling

import (
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func scrape(t *testing.T, c *Controller) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(c))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if mf.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			lines = append(lines, mf.GetName()+"{"+strings.Join(labels, ",")+"} "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestCollector(t *testing.T) {
	c := New(tuned())
	mustReport(t, c, "q", 5500, t0)
	c.Tick(t0) // e = −0.1: kp −40, integral −10 → 50%
	want := strings.Join([]string{
		"tollgate_sampling_controller_enabled{kind=locate} 1",
		"tollgate_sampling_controller_input_backlog{kind=locate} 5500",
		"tollgate_sampling_controller_integral_percent{kind=locate} -10",
		"tollgate_sampling_controller_output_percent{kind=locate} 50",
		"tollgate_sampling_controller_reports_total{kind=locate,result=accepted} 1",
		"tollgate_sampling_controller_reports_total{kind=locate,result=rejected} 0",
		"tollgate_sampling_controller_sources{kind=locate} 1",
		"tollgate_sampling_controller_steps_total{kind=locate} 1",
		"tollgate_sampling_controller_target_backlog{kind=locate} 5000",
	}, "\n")
	if got := scrape(t, c); got != want {
		t.Fatalf("metrics:\n%s\nwant:\n%s", got, want)
	}

	p := tuned()
	p.Kp = -1
	got := scrape(t, New(p))
	if !strings.Contains(got, "tollgate_sampling_controller_enabled{kind=locate} 0") || strings.Contains(got, "output_percent") {
		t.Fatalf("disabled controller metrics:\n%s", got)
	}
	if got := scrape(t, Disabled(nil)); got != "" {
		t.Fatalf("unconfigured controller exports:\n%s", got)
	}
}
