package partmove

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type promMetrics struct {
	pending prometheus.Gauge
	moved   prometheus.Counter
	series  prometheus.Counter
	took    prometheus.Histogram
	steps   *prometheus.CounterVec
}

// NewMetrics registers the coordinator's metrics with reg.
func NewMetrics(reg prometheus.Registerer) Metrics {
	m := &promMetrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_partition_moves_pending",
			Help: "Partitions whose owner differs from the raised layout's target, as group 0's leader last counted (0 elsewhere)."}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_partition_moves_total",
			Help: "Partition hand-offs this node coordinated to their end."}),
		series: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_partition_moved_series_total",
			Help: "Series carried by the hand-offs this node coordinated."}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_partition_move_duration_seconds",
			Help: "Time from a move's first step to its end.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_partition_move_steps_total",
			Help: "Hand-off steps done by this node's coordinator, by kind (give, receive, route, complete)."}, []string{"kind"}),
	}
	reg.MustRegister(m.pending, m.moved, m.series, m.took, m.steps)
	return m
}

func (m *promMetrics) Pending(n int) { m.pending.Set(float64(n)) }
func (m *promMetrics) Moved(series int64, took time.Duration) {
	m.moved.Inc()
	m.series.Add(float64(series))
	m.took.Observe(took.Seconds())
}
func (m *promMetrics) Step(kind string) { m.steps.WithLabelValues(kind).Inc() }
