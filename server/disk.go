package server

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// A node whose disk refuses raft writes (full, read-only, failing) is not
// ready: raftnode reports it (Host.DiskError), hands the node's leaderships
// to other voters and clears it by itself once writes succeed again.

var descDiskWritable = prometheus.NewDesc("tollgate_disk_writable",
	"1 if this node can write its raft state (data dir probe and every raft log/term write succeeding); 0 while the disk refuses writes (see /readyz for the reason).", nil, nil)

// The node's shared raft log (raftnode/wal): every group's appends that
// arrive while a write is being made durable share the next write and its
// fdatasync, so appends/rounds is the batching it achieves.
var (
	descLogRounds = prometheus.NewDesc("tollgate_raft_log_rounds_total",
		"Writes of the node's shared raft log: one write and one fdatasync each, carrying the appends and deletes of every group that arrived meanwhile.", nil, nil)
	descLogFailed = prometheus.NewDesc("tollgate_raft_log_failed_rounds_total",
		"Writes of the shared raft log whose write or fdatasync failed (cut off again; their appends failed).", nil, nil)
	descLogAppends = prometheus.NewDesc("tollgate_raft_log_appends_total",
		"Appends and deletes of all groups written to the shared raft log; divided by rounds, the group commit's batching.", nil, nil)
	descLogBytes = prometheus.NewDesc("tollgate_raft_log_written_bytes_total",
		"Bytes written to the shared raft log.", nil, nil)
	descLogSync = prometheus.NewDesc("tollgate_raft_log_sync_seconds_total",
		"Time the shared raft log spent in write and fdatasync.", nil, nil)
	descLogGrowing = prometheus.NewDesc("tollgate_raft_log_growing_rounds_total",
		"Writes of the shared raft log that grew its file, so that their fdatasync also made a new length durable (a journal commit); the log writes zeros ahead so that most rounds overwrite them in place instead.", nil, nil)
	descLogZeroFailed = prometheus.NewDesc("tollgate_raft_log_zero_ahead_failed_total",
		"Growing writes of the shared raft log whose zeros ahead could not be written (a nearly full disk); they went on without them.", nil, nil)
	descLogSegments = prometheus.NewDesc("tollgate_raft_log_segments",
		"Segment files of the shared raft log on disk.", nil, nil)
)

type diskCollector struct{ s *Server }

func (c *diskCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDiskWritable, descLogRounds, descLogFailed, descLogAppends, descLogBytes, descLogSync, descLogGrowing, descLogZeroFailed, descLogSegments} {
		ch <- d
	}
}

func (c *diskCollector) Collect(ch chan<- prometheus.Metric) {
	v := 1.0
	if c.s.diskNotReady() != "" {
		v = 0
	}
	ch <- prometheus.MustNewConstMetric(descDiskWritable, prometheus.GaugeValue, v)
	if c.s.host == nil {
		return
	}
	st := c.s.host.LogStats()
	ch <- prometheus.MustNewConstMetric(descLogRounds, prometheus.CounterValue, float64(st.Rounds))
	ch <- prometheus.MustNewConstMetric(descLogFailed, prometheus.CounterValue, float64(st.FailedRounds))
	ch <- prometheus.MustNewConstMetric(descLogAppends, prometheus.CounterValue, float64(st.Requests))
	ch <- prometheus.MustNewConstMetric(descLogBytes, prometheus.CounterValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(descLogSync, prometheus.CounterValue, st.SyncSeconds)
	ch <- prometheus.MustNewConstMetric(descLogGrowing, prometheus.CounterValue, float64(st.GrowingRounds))
	ch <- prometheus.MustNewConstMetric(descLogZeroFailed, prometheus.CounterValue, float64(st.ZeroAheadFailed))
	ch <- prometheus.MustNewConstMetric(descLogSegments, prometheus.GaugeValue, float64(st.Segments))
}

// diskNotReady is the readiness reason of a disk that refuses raft writes,
// on one line, or "".
func (s *Server) diskNotReady() string {
	if s.host == nil {
		return ""
	}
	err := s.host.DiskError()
	if err == nil {
		return ""
	}
	return "disk not writable: " + strings.ReplaceAll(err.Error(), "\n", "; ")
}
