package sampleprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/clientlib/sampling"
)

var (
	descDecisions = prometheus.NewDesc("tollgate_client_sample_decisions_total",
		"Sampling decisions by kind and outcome (sampled: kept, dropped: not kept).", []string{"kind", "decision"}, nil)
	descKeyDecisions = prometheus.NewDesc("tollgate_client_sample_key_decisions_total",
		"Sampling decisions by key, kind and outcome; keys beyond the client's bound are summed under key=\"_other\".",
		[]string{"key", "kind", "decision"}, nil)
	descVersion = prometheus.NewDesc("tollgate_client_sample_config_version",
		"Version of the sample rates the client decides from (0: built-in, everything 100%).", nil, nil)
	descUpdates = prometheus.NewDesc("tollgate_client_sample_config_updates_total",
		"Sample-rate snapshots offered to the client, by result (applied, refused: invalid or stale).", []string{"result"}, nil)
	descGlobal = prometheus.NewDesc("tollgate_client_sample_global_percent",
		"Global sample percentage per kind in the rates in force (kinds not listed are 100).", []string{"kind"}, nil)
)

// Collector reads a Sampler's Stats at scrape time, so the hot path keeps its
// plain atomic counters and nothing has to be kept in sync.
type Collector struct{ s *sampling.Sampler }

// NewCollector returns a Collector for s; register it on the program's registry.
func NewCollector(s *sampling.Sampler) *Collector { return &Collector{s: s} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecisions, descKeyDecisions, descVersion, descUpdates, descGlobal} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for kind, n := range st.Kinds {
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(n.Sampled), kind, "sampled")
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(n.Dropped), kind, "dropped")
	}
	for key, kinds := range st.Keys {
		for kind, n := range kinds {
			ch <- prometheus.MustNewConstMetric(descKeyDecisions, prometheus.CounterValue, float64(n.Sampled), key, kind, "sampled")
			ch <- prometheus.MustNewConstMetric(descKeyDecisions, prometheus.CounterValue, float64(n.Dropped), key, kind, "dropped")
		}
	}
	ch <- prometheus.MustNewConstMetric(descVersion, prometheus.GaugeValue, float64(st.Version))
	ch <- prometheus.MustNewConstMetric(descUpdates, prometheus.CounterValue, float64(st.Updates), "applied")
	ch <- prometheus.MustNewConstMetric(descUpdates, prometheus.CounterValue, float64(st.Refused), "refused")
	for kind, p := range c.s.Rates().Global {
		ch <- prometheus.MustNewConstMetric(descGlobal, prometheus.GaugeValue, p, kind)
	}
}
