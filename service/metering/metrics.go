package metering

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	s      *Service
	events *prometheus.CounterVec
	// movedRetries counts events sent again after a group answered Moved.
	movedRetries prometheus.Counter
	// leaderWaits counts events held and sent again because no leader of
	// their group was known (SubmitBatch).
	leaderWaits prometheus.Counter
	planned     prometheus.Counter
	executed    prometheus.Counter
	sinkDur     prometheus.Histogram
	scanDur     prometheus.Histogram
	passDur     prometheus.Histogram
	sinkResp    *prometheus.CounterVec
	deadTotal   prometheus.Counter
	spansOpen   *prometheus.Desc
	spans       *prometheus.Desc
	pending     *prometheus.Desc
	lag         *prometheus.Desc
	deadLedger  *prometheus.Desc
	records     *prometheus.Desc
	seriesMem   *prometheus.Desc
}

// samplerBuckets bound the sampler histograms: 0.1 ms to 5 s, with 10 ms
// (the target for a pass with 1,000 spans due) a bound of its own.
var samplerBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

func newMetrics(s *Service) *metrics {
	return &metrics{
		s: s,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_metering_events_total",
			Help: "Start/stop events answered by this node, by kind and HTTP status."}, []string{"kind", "code"}),
		movedRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_metering_moved_retries_total",
			Help: "Events this node sent again after a group answered that their partition's metering is elsewhere (a partition move)."}),
		leaderWaits: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_metering_leader_waits_total",
			Help: "Events this node held and sent again because no leader of their group was known to it (an election or a leadership hand-off)."}),
		planned: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_metering_intervals_planned_total",
			Help: "Intervals planned by samplers on this node."}),
		executed: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_metering_intervals_executed_total",
			Help: "Intervals executed (records written to the ledger) by samplers on this node."}),
		sinkDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_metering_sink_request_seconds",
			Help: "HTTP sink call latency.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		// The sampler's cost per pass: finding the due spans should grow with
		// the spans due, not with every span held, and these show it on a
		// live node (tollgate scalebench reads them).
		scanDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_metering_sampler_scan_seconds",
			Help:    "Time a sampler pass took to find the spans with work due (every pass that looked), groups led here.",
			Buckets: samplerBuckets}),
		passDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_metering_sampler_pass_seconds",
			Help:    "Time of a sampler pass that had work: finding it, proposing the plan and execute entries, and their commit; groups led here.",
			Buckets: samplerBuckets}),
		sinkResp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_metering_sink_responses_total",
			Help: `HTTP sink responses by status code ("error" for transport failures).`}, []string{"code"}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_metering_dead_letters_total",
			Help: "Records the HTTP sink refused for good (4xx other than 429), recorded by samplers on this node."}),
		spansOpen:  prometheus.NewDesc("tollgate_metering_spans_open", "Spans started and not stopped (groups led here).", []string{"group"}, nil),
		spans:      prometheus.NewDesc("tollgate_metering_spans", "Spans not fully sampled (groups led here).", []string{"group"}, nil),
		pending:    prometheus.NewDesc("tollgate_metering_spans_pending", "Spans with an interval due now (groups led here).", []string{"group"}, nil),
		lag:        prometheus.NewDesc("tollgate_metering_lag_seconds", "Now minus the oldest unsampled boundary (groups led here; 0 when caught up).", []string{"group"}, nil),
		deadLedger: prometheus.NewDesc("tollgate_metering_dead_letters", "Dead letters held in raft (groups led here).", []string{"group"}, nil),
		records:    prometheus.NewDesc("tollgate_metering_ledger_records", "Usage records in the ledger (groups led here).", []string{"group"}, nil),
		seriesMem: prometheus.NewDesc("tollgate_metering_series_bytes",
			"Memory held by active-series samples for billing (groups led here): the open month at full resolution, closed months compacted.", []string{"group"}, nil),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	// At zero from the start, so dashboards and alerts see 0, not no series,
	// before the first event or sink failure.
	m.sinkResp.WithLabelValues("error")
	for _, k := range []string{"start", "stop"} {
		m.events.WithLabelValues(k, "201")
	}
	for _, c := range []prometheus.Collector{m.events, m.movedRetries, m.leaderWaits, m.planned, m.executed, m.sinkDur, m.scanDur, m.passDur, m.sinkResp, m.deadTotal, m} {
		if err := r.Register(c); err != nil {
			return errors.Join(errors.New("metering metrics"), err)
		}
	}
	return nil
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.spansOpen, m.spans, m.pending, m.lag, m.deadLedger, m.records, m.seriesMem} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, gs := range m.s.Status().Groups {
		if !gs.Leader {
			continue
		}
		g := strconv.Itoa(gs.Group)
		ch <- prometheus.MustNewConstMetric(m.spansOpen, prometheus.GaugeValue, float64(gs.SpansOpen), g)
		ch <- prometheus.MustNewConstMetric(m.spans, prometheus.GaugeValue, float64(gs.Spans), g)
		ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(gs.Pending), g)
		ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, float64(gs.LagMs)/1000, g)
		ch <- prometheus.MustNewConstMetric(m.deadLedger, prometheus.GaugeValue, float64(gs.DeadLetters), g)
		ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(gs.Records), g)
		ch <- prometheus.MustNewConstMetric(m.seriesMem, prometheus.GaugeValue, float64(gs.SeriesBytes), g)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
