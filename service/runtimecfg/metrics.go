package runtimecfg

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	errors  *prometheus.CounterVec
	changes *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, s *Service) (*metrics, error) {
	m := &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_config_apply_errors_total",
			Help: "Runtime config changes refused or failed, by reason (invalid, conflict, cluster_version, unavailable).",
		}, []string{"reason"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_config_changes_total",
			Help: "Runtime config changes committed through this node, by operation (set, apply).",
		}, []string{"op"}),
	}
	// Every reason and operation at zero from the start, so alerts on them
	// see a 0 rather than no series until the first change.
	for _, r := range []string{"invalid", "conflict", "cluster_version", "unavailable"} {
		m.errors.WithLabelValues(r)
	}
	for _, op := range []string{"set", "apply"} {
		m.changes.WithLabelValues(op)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.errors, m.changes, newVersionCollector(s)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// versionCollector reads the versions at scrape time.
type versionCollector struct {
	s                *Service
	version, replica *prometheus.Desc
}

func newVersionCollector(s *Service) *versionCollector {
	return &versionCollector{s: s,
		version: prometheus.NewDesc("tollgate_config_version",
			"Newest runtime config version held by this node (0: none replicated).", nil, nil),
		replica: prometheus.NewDesc("tollgate_config_replica_version",
			"Runtime config version of this node's replica of each group it holds.", []string{"group"}, nil),
	}
}

func (c *versionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.version
	ch <- c.replica
}

func (c *versionCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.version, prometheus.GaugeValue, float64(c.s.Newest().Version))
	for g := range c.s.b.Groups() {
		if m := c.s.b.Module(g); m != nil {
			ch <- prometheus.MustNewConstMetric(c.replica, prometheus.GaugeValue, float64(m.Current().Version), strconv.Itoa(g))
		}
	}
}
