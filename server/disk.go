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

type diskCollector struct{ s *Server }

func (c *diskCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descDiskWritable }

func (c *diskCollector) Collect(ch chan<- prometheus.Metric) {
	v := 1.0
	if c.s.diskNotReady() != "" {
		v = 0
	}
	ch <- prometheus.MustNewConstMetric(descDiskWritable, prometheus.GaugeValue, v)
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
