package gateway

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's own series (package doc lists them).
type metrics struct {
	requests      *prometheus.CounterVec
	series        *prometheus.CounterVec
	samples       *prometheus.CounterVec
	invalid       *prometheus.CounterVec
	forwarded     *prometheus.CounterVec
	failOpen      *prometheus.CounterVec
	upstream      *prometheus.HistogramVec
	duration      prometheus.Histogram
	own           prometheus.Histogram
	refreshes     *prometheus.CounterVec
	trackDuration prometheus.Histogram
	inflight      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, g *Gateway) (*metrics, error) {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_requests_total",
			Help: "Remote-write requests answered, by HTTP status code."}, []string{"code"}),
		series: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_series_total",
			Help: "Series of remote-write requests by tenant, decision (accepted, rejected) and reason (within_limit, fail_open, series_limit, partition_limit, rate_limit, tollgate_unavailable, tollgate_error)."},
			[]string{"tenant", "decision", "reason"}),
		samples: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_samples_total",
			Help: "Samples (float and histogram) of remote-write requests by tenant, decision and reason, as tollgate_gateway_series_total."},
			[]string{"tenant", "decision", "reason"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_invalid_requests_total",
			Help: "Requests refused before any series was decided (bad snappy, protobuf or labels; too large), by tenant."}, []string{"tenant"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_forwarded_samples_total",
			Help: "Samples the upstream acknowledged (2xx), by tenant."}, []string{"tenant"}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_fail_open_total",
			Help: "Requests Tollgate could not decide, by tenant and what the gateway did (open: forwarded, closed: 503)."}, []string{"tenant", "decision"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tollgate_gateway_upstream_duration_seconds",
			Help: "Time to forward one request to the upstream, by the class of its answer: 2xx, 4xx, 5xx, timeout, unreachable.", Buckets: buckets}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_gateway_request_duration_seconds",
			Help: "Time from a remote-write request's arrival to its answer.", Buckets: buckets}),
		own: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_gateway_own_duration_seconds",
			Help:    "Time a request spent in the gateway itself (its arrival to its answer, minus the forward to the upstream): what the gateway adds to a sender's latency, Tollgate's decision included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0015, .002, .003, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_gateway_background_refreshes_total",
			Help: "Background refreshes of series still fresh (tracked again before they go stale, off the requests' path), by result: ok, rejected, failed, or deferred (the refreshes in flight at their limit: left to a later request)."}, []string{"result"}),
		trackDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_gateway_track_duration_seconds",
			Help: "Time Tollgate took to decide a request's series.", Buckets: buckets}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_gateway_inflight_requests",
			Help: "Remote-write requests being decided or forwarded."}),
	}
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_gateway_ready",
		Help: "1 when /readyz answers 200 (Tollgate and the upstream reachable), else 0."}, func() float64 {
		if g.Ready(context.Background()) != nil {
			return 0
		}
		return 1
	})
	// Known label values exist from the start, so panels and alerts see 0
	// rather than no data (per-tenant series appear with a tenant's first
	// request).
	for _, code := range []string{"200", "204", "400", "401", "413", "415", "429", "500", "502", "503", "504"} {
		m.requests.WithLabelValues(code)
	}
	for _, r := range []string{"ok", "rejected", "failed"} {
		m.refreshes.WithLabelValues(r)
	}
	for _, class := range []string{"2xx", "4xx", "5xx", "timeout", "unreachable"} {
		m.upstream.WithLabelValues(class)
	}
	for _, c := range []prometheus.Collector{m.requests, m.series, m.samples, m.invalid, m.forwarded, m.failOpen, m.upstream, m.duration, m.own, m.refreshes, m.trackDuration, m.inflight, ready} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// count adds series and samples under one decision and reason.
func (m *metrics) count(tenant, decision, reason string, series, samples int) {
	if series > 0 {
		m.series.WithLabelValues(tenant, decision, reason).Add(float64(series))
	}
	if samples > 0 {
		m.samples.WithLabelValues(tenant, decision, reason).Add(float64(samples))
	}
}
