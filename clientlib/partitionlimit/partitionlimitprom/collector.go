package partitionlimitprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
)

const ns = "tollgate_client_partition_limit_"

var (
	descChecks = prometheus.NewDesc(ns+"checks_total",
		"Check calls by result (accepted, unlimited: tenant without a limit, rejected).", []string{"result"}, nil)
	descRejected = prometheus.NewDesc(ns+"rejected_total",
		"Rejected Check calls by reason (partition_limit, invalid).", []string{"reason"}, nil)
	descPushes = prometheus.NewDesc(ns+"pushes_total",
		"PushSketches calls by result (ok, failed: no node accepted, kept for the next interval; refused: InvalidArgument, dropped).",
		[]string{"result"}, nil)
	descResends = prometheus.NewDesc(ns+"resends_total",
		"Full pushes of every in-window sketch after the node changed (failover, restart, broken watch stream).", nil, nil)
	descSketches = prometheus.NewDesc(ns+"sketches_total",
		"Sketches pushed to and received from nodes.", []string{"direction"}, nil)
	descBytes = prometheus.NewDesc(ns+"bytes_total",
		"Protobuf bytes pushed to and received from nodes.", []string{"direction"}, nil)
	descBadReceived = prometheus.NewDesc(ns+"bad_received_total",
		"Received sketches that failed validation (ignored).", nil, nil)
	descReconnects = prometheus.NewDesc(ns+"watch_reconnects_total",
		"WatchSketches streams reopened.", nil, nil)
	descRemote = prometheus.NewDesc(ns+"remote",
		"1 for the current state of the synchronisation with the nodes (local-only, connected, degraded, unreachable: deciding from what is held).",
		[]string{"state"}, nil)
	descLastPush = prometheus.NewDesc(ns+"last_push_timestamp_seconds",
		"Unix time of the last successful push (0: none).", nil, nil)
	descLastReceive = prometheus.NewDesc(ns+"last_receive_timestamp_seconds",
		"Unix time of the last batch merged from a node (0: none).", nil, nil)
	descTenants = prometheus.NewDesc(ns+"tenants",
		"Tenants with state in the limiter.", nil, nil)
	descPartitions = prometheus.NewDesc(ns+"partitions",
		"(tenant, partition) states held.", nil, nil)
)

var remoteStates = []string{partitionlimit.RemoteLocalOnly, partitionlimit.RemoteConnected, partitionlimit.RemoteDegraded, partitionlimit.RemoteUnreachable}

// Collector reads a Limiter's Stats at scrape time, so Check keeps its plain
// atomic counters and nothing has to be kept in sync.
type Collector struct{ l *partitionlimit.Limiter }

// NewCollector returns a Collector for l; register it on the program's registry.
func NewCollector(l *partitionlimit.Limiter) *Collector { return &Collector{l: l} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descChecks, descRejected, descPushes, descResends, descSketches, descBytes,
		descBadReceived, descReconnects, descRemote, descLastPush, descLastReceive, descTenants, descPartitions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var rejected uint64
	for reason, n := range st.Rejected {
		counter(descRejected, n, reason)
		rejected += n
	}
	counter(descChecks, st.Accepted, "accepted")
	counter(descChecks, st.Unlimited, "unlimited")
	counter(descChecks, rejected, "rejected")
	counter(descPushes, st.Pushes, "ok")
	counter(descPushes, st.PushFailures, "failed")
	counter(descPushes, st.PushRejected, "refused")
	counter(descResends, st.Resends)
	counter(descSketches, st.SketchesPushed, "pushed")
	counter(descSketches, st.SketchesReceived, "received")
	counter(descBytes, st.BytesPushed, "pushed")
	counter(descBytes, st.BytesReceived, "received")
	counter(descBadReceived, st.BadReceived)
	counter(descReconnects, st.WatchReconnects)
	for _, s := range remoteStates {
		v := 0.0
		if s == st.Remote {
			v = 1
		}
		gauge(descRemote, v, s)
	}
	ts := func(d *prometheus.Desc, t time.Time) {
		if t.IsZero() {
			gauge(d, 0)
			return
		}
		gauge(d, float64(t.UnixNano())/1e9)
	}
	ts(descLastPush, st.LastPush)
	ts(descLastReceive, st.LastReceive)
	gauge(descTenants, float64(st.Tenants))
	gauge(descPartitions, float64(st.Partitions))
}
