package summaries

import "github.com/prometheus/client_golang/prometheus"

// Collectors export the hub's counters at scrape time.
func (h *Hub) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_summary_subscribers", Help: "Open WatchSummaries streams on this node."},
			func() float64 { return float64(h.Stats().Subscribers) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_summary_updates_total", Help: "Summary updates queued to WatchSummaries subscribers."},
			func() float64 { return float64(h.Stats().Updates) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_summary_dropped_subscribers_total", Help: "WatchSummaries subscribers dropped because they read too slowly."},
			func() float64 { return float64(h.Stats().Dropped) }),
	}
}
