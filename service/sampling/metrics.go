package sampling

import "github.com/prometheus/client_golang/prometheus"

var (
	descOutput = prometheus.NewDesc("tollgate_sampling_controller_output_percent",
		"Global sample percentage the backlog controller sets for its kind.", []string{"kind"}, nil)
	descInput = prometheus.NewDesc("tollgate_sampling_controller_input_backlog",
		"Backlog (sum of fresh reports) the controller's last step used.", []string{"kind"}, nil)
	descTarget = prometheus.NewDesc("tollgate_sampling_controller_target_backlog",
		"Backlog the controller holds the kind's traffic to.", []string{"kind"}, nil)
	descIntegral = prometheus.NewDesc("tollgate_sampling_controller_integral_percent",
		"Integral term of the controller (percentage points, ≤ 0).", []string{"kind"}, nil)
	descEnabled = prometheus.NewDesc("tollgate_sampling_controller_enabled",
		"1 if the backlog controller runs; 0 if its parameters are invalid (reason in status and logs).", []string{"kind"}, nil)
	descSources = prometheus.NewDesc("tollgate_sampling_controller_sources",
		"Sources with a fresh backlog report.", []string{"kind"}, nil)
	descSteps = prometheus.NewDesc("tollgate_sampling_controller_steps_total",
		"Control steps run.", []string{"kind"}, nil)
	descReports = prometheus.NewDesc("tollgate_sampling_controller_reports_total",
		"Backlog reports by result (accepted, rejected).", []string{"kind", "result"}, nil)
)

// Collector exports a Controller's Status at scrape time. A disabled controller
// exports only enabled = 0 and its report counters, so dashboards do not plot a
// stale output.
type Collector struct{ c *Controller }

// NewCollector returns a Collector for c; the server registers it.
func NewCollector(c *Controller) *Collector { return &Collector{c: c} }

// Describe implements prometheus.Collector.
func (x *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutput, descInput, descTarget, descIntegral, descEnabled, descSources, descSteps, descReports} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (x *Collector) Collect(ch chan<- prometheus.Metric) {
	st := x.c.Status()
	if st.Kind == "" {
		return // no controller configured
	}
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.Kind)
	}
	enabled := 0.0
	if st.Enabled {
		enabled = 1
		g(descOutput, st.OutputPercent)
		g(descTarget, st.Target)
		g(descIntegral, st.IntegralPercent)
		if st.HasInput {
			g(descInput, st.InputBacklog)
		}
	}
	g(descEnabled, enabled)
	g(descSources, float64(st.Sources))
	ch <- prometheus.MustNewConstMetric(descSteps, prometheus.CounterValue, float64(st.Steps), st.Kind)
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(st.Reports), st.Kind, "accepted")
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(st.Rejected), st.Kind, "rejected")
}
