package server

import (
	"crypto/tls"
	"crypto/x509"
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tollgate-io/tollgate/datadir"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/version"
)

// metrics are registered on a per-server registry (no global state), exposed on
// /metrics. Names follow Prometheus conventions with the tollgate_ prefix.
type metrics struct {
	reg *prometheus.Registry

	requests      *prometheus.CounterVec   // by method, code
	requestDur    *prometheus.HistogramVec // by method
	seriesCreated *prometheus.CounterVec   // by group
	seriesRefresh *prometheus.CounterVec
	seriesReject  *prometheus.CounterVec
	entries       *prometheus.CounterVec
	entryBytes    *prometheus.CounterVec
	batchHashes   prometheus.Histogram
	commitDur     *prometheus.HistogramVec
	limitsReloads *prometheus.CounterVec
	// streamsRefused counts watch streams refused by the stream bounds (access.StreamBounds).
	streamsRefused prometheus.Counter
	// streamsSlow counts watch streams closed as slow readers (access.StreamBounds).
	streamsSlow prometheus.Counter
	// moves counts replica moves by result; misplaced is the replicas of
	// groups led here that placement wants elsewhere (cluster/move.go).
	moves     *prometheus.CounterVec
	misplaced prometheus.Gauge
}

func newMetrics(groupStats func() []groupStat) *metrics {
	reg := prometheus.NewRegistry()
	// Beside the usual Go metrics: how long runnable goroutines waited for a
	// CPU (go_sched_latencies_seconds) and how long the world was stopped
	// (go_sched_pauses_total_gc_seconds, _other_seconds), the two ways a busy
	// host stalls raft's timers (docs/operations.md: failover under load).
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/(latencies|pauses/total/.*):seconds$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grpc_requests_total", Help: "gRPC requests by method and status code.",
		}, []string{"method", "code"}),
		requestDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tollgate_grpc_request_duration_seconds", Help: "gRPC request latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"method"}),
		seriesCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_series_created_total", Help: "Series accepted as new by this node while leading the group.",
		}, []string{"group"}),
		seriesRefresh: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_series_refreshed_logged_total", Help: "Refreshes written to the log (at most one per series per minute).",
		}, []string{"group"}),
		seriesReject: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_series_rejected_total", Help: "Series rejected because the tenant reached its group share of max_series.",
		}, []string{"group"}),
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_raft_track_entries_total", Help: "Track entries appended by this node as leader.",
		}, []string{"group"}),
		entryBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_raft_track_entry_bytes_total", Help: "Bytes of track entries appended.",
		}, []string{"group"}),
		batchHashes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tollgate_raft_entry_hashes", Help: "Hashes logged per track entry.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		commitDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tollgate_raft_commit_duration_seconds", Help: "Time from append to applied on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"group"}),
		limitsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_limits_reloads_total", Help: "Runtime limits file reloads by result.",
		}, []string{"result"}),
	}
	m.streamsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tollgate_watch_streams_refused_total", Help: "Watch streams refused because the node's or the client's stream bound was reached.",
	})
	reg.MustRegister(m.streamsRefused)
	m.streamsSlow = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tollgate_watch_streams_slow_total", Help: "Watch streams closed because a message waited longer than the send timeout for the client to read (slow reader).",
	})
	reg.MustRegister(m.streamsSlow)
	m.moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_placement_moves_total", Help: "Replica moves this node started as a group leader, by result (done, failed) and transfers of leadership made so that another leader moves this node's replica.",
	}, []string{"result"})
	m.misplaced = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_placement_misplaced_replicas", Help: "Voters of the groups led here that placement wants on another node (sum over nodes: the moves left in the cluster).",
	})
	reg.MustRegister(m.moves, m.misplaced)
	reg.MustRegister(m.requests, m.requestDur, m.seriesCreated, m.seriesRefresh, m.seriesReject,
		m.entries, m.entryBytes, m.batchHashes, m.commitDur, m.limitsReloads)
	reg.MustRegister(&groupCollector{stats: groupStats})
	// The build is fixed for the process lifetime: a constant 1 whose labels say
	// what runs, so dashboards can join on it and spot mixed versions in a cluster.
	bi := version.Get()
	rev := bi.Revision
	if bi.Modified {
		rev += "+dirty"
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "tollgate_build_info",
		Help:        "Always 1; the labels name the running build (release version, VCS revision, Go version).",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": rev, "goversion": bi.GoVersion},
	}, func() float64 { return 1 }))
	return m
}

// initGroups exports every per-group counter at zero from the start, so a
// dashboard or alert sees "0 rejected" instead of no series at all until the
// first event (absent() and rate() then behave as an operator expects).
func (m *metrics) initGroups(groups int) {
	for g := range groups {
		m.initGroup(g)
	}
	m.limitsReloads.WithLabelValues("success")
	m.limitsReloads.WithLabelValues("failure")
}

// initGroup exports group g's counters at zero (at start, or when a raise
// adds the group).
func (m *metrics) initGroup(g int) {
	l := strconv.Itoa(g)
	m.seriesCreated.WithLabelValues(l)
	m.seriesRefresh.WithLabelValues(l)
	m.seriesReject.WithLabelValues(l)
	m.entries.WithLabelValues(l)
	m.entryBytes.WithLabelValues(l)
	m.commitDur.WithLabelValues(l)
}

// initMethods exports the request counter and histogram of every gRPC method
// the node serves at zero (code OK), for the same reason as initGroups.
func (m *metrics) initMethods(info map[string]grpc.ServiceInfo) {
	for svc, si := range info {
		for _, md := range si.Methods {
			name := "/" + svc + "/" + md.Name
			m.requests.WithLabelValues(name, codes.OK.String())
			m.requestDur.WithLabelValues(name)
		}
	}
}

func (m *metrics) seriesDecided(group, created, refreshed, rejected int) {
	g := strconv.Itoa(group)
	if created > 0 {
		m.seriesCreated.WithLabelValues(g).Add(float64(created))
	}
	if refreshed > 0 {
		m.seriesRefresh.WithLabelValues(g).Add(float64(refreshed))
	}
	if rejected > 0 {
		m.seriesReject.WithLabelValues(g).Add(float64(rejected))
	}
}

func (m *metrics) entryAppended(group, bytes, hashes int) {
	g := strconv.Itoa(group)
	m.entries.WithLabelValues(g).Inc()
	m.entryBytes.WithLabelValues(g).Add(float64(bytes))
	m.batchHashes.Observe(float64(hashes))
}

func (m *metrics) commitLatency(group int, d time.Duration) {
	m.commitDur.WithLabelValues(strconv.Itoa(group)).Observe(d.Seconds())
}

type groupStat struct {
	group        int
	series       int64
	tenants      int
	leader       bool
	appliedIndex uint64
	term         uint64
	halted       bool
	nearLimit    int
	replicaDown  bool
}

// groupCollector reads group state at scrape time instead of keeping gauges in sync.
type groupCollector struct{ stats func() []groupStat }

var (
	descSeries  = prometheus.NewDesc("tollgate_active_series", "Active series held by this replica of the group.", []string{"group"}, nil)
	descTenants = prometheus.NewDesc("tollgate_tenants", "Tenants with active series in the group.", []string{"group"}, nil)
	descLeader  = prometheus.NewDesc("tollgate_group_leader", "1 if this node leads the group.", []string{"group"}, nil)
	descApplied = prometheus.NewDesc("tollgate_raft_applied_index", "Last raft index applied to the group's FSM.", []string{"group"}, nil)
	descNear    = prometheus.NewDesc("tollgate_tenants_near_limit", "Tenants at or above near_limit_fraction of their share of the group, as this replica sees them.", []string{"group"}, nil)
	descDown    = prometheus.NewDesc("tollgate_group_replica_down", "1 if this node's raft replica of the group is shut down while the node runs: it neither votes nor stores the log, though the group's configuration may count it as a voter (restart the node).", []string{"group"}, nil)
	descTerm    = prometheus.NewDesc("tollgate_raft_term", "The group's raft term as this node knows it. Every election (including a planned leadership transfer) raises it by at least one, so changes() over a window counts elections; pre-vote rounds that fail do not.", []string{"group"}, nil)
	descHalted  = prometheus.NewDesc("tollgate_group_halted", "1 if the group's FSM stopped applying on this node (an entry it cannot apply; see /readyz for the reason).", []string{"group"}, nil)
)

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSeries
	ch <- descTenants
	ch <- descLeader
	ch <- descApplied
	ch <- descTerm
	ch <- descHalted
	ch <- descNear
	ch <- descDown
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stats() {
		g := strconv.Itoa(s.group)
		lead := 0.0
		if s.leader {
			lead = 1
		}
		ch <- prometheus.MustNewConstMetric(descSeries, prometheus.GaugeValue, float64(s.series), g)
		ch <- prometheus.MustNewConstMetric(descTenants, prometheus.GaugeValue, float64(s.tenants), g)
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, lead, g)
		// A gauge, not a counter: the index can go back when a replica is restored
		// from a snapshot, and rate() over it would misread that as a reset.
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(s.appliedIndex), g)
		ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(s.term), g)
		halted := 0.0
		if s.halted {
			halted = 1
		}
		ch <- prometheus.MustNewConstMetric(descHalted, prometheus.GaugeValue, halted, g)
		ch <- prometheus.MustNewConstMetric(descNear, prometheus.GaugeValue, float64(s.nearLimit), g)
		down := 0.0
		if s.replicaDown {
			down = 1
		}
		ch <- prometheus.MustNewConstMetric(descDown, prometheus.GaugeValue, down, g)
	}
}

// clusterCollector exports the node's cluster view at scrape time, so a dead
// node ("failed") or a group without a leader shows up on every live node.
type clusterCollector struct{ s *Server }

var (
	descMembers   = prometheus.NewDesc("tollgate_cluster_members", "Members known to this node by serf status (alive, leaving, left, failed).", []string{"status"}, nil)
	descHasLeader = prometheus.NewDesc("tollgate_group_has_leader", "1 if this node knows a leader for the group.", []string{"group"}, nil)
	descVoters    = prometheus.NewDesc("tollgate_group_voters", "Voters in the group's raft configuration as this node knows it (0 when it is not a member).", []string{"group"}, nil)
	descVotersOut = prometheus.NewDesc("tollgate_group_voters_not_alive", "Voters in the group's raft configuration (as this node knows it) whose node serf does not list as alive: failed, leaving, left or unknown.", []string{"group"}, nil)
	descReady     = prometheus.NewDesc("tollgate_ready", "1 if the node is ready to serve (what /readyz answers 200 for), else 0.", nil, nil)
)

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descMembers
	ch <- descHasLeader
	ch <- descVoters
	ch <- descVotersOut
	ch <- descReady
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ready := 0.0
	if c.s.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	v, _ := c.s.view.get()
	if v == nil {
		return
	}
	counts := map[string]int{"alive": 0, "leaving": 0, "left": 0, "failed": 0}
	alive := map[string]bool{}
	for _, m := range v.Members {
		counts[m.Status]++
		alive[m.Id] = m.Status == membership.StatusAlive
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(n), st)
	}
	for _, gi := range v.GroupInfo {
		g := strconv.Itoa(int(gi.Group))
		has := 0.0
		if gi.LeaderId != "" {
			has = 1
		}
		ch <- prometheus.MustNewConstMetric(descHasLeader, prometheus.GaugeValue, has, g)
		ch <- prometheus.MustNewConstMetric(descVoters, prometheus.GaugeValue, float64(len(gi.Voters)), g)
		out := 0
		for _, id := range gi.Voters {
			if !alive[id] {
				out++
			}
		}
		ch <- prometheus.MustNewConstMetric(descVotersOut, prometheus.GaugeValue, float64(out), g)
	}
}

// filesystemCollector exports the free and total bytes of the filesystem holding the
// data dir at scrape time: raft logs and snapshots stop being written when it
// fills, and a full disk is the one outage an operator can see coming.
type filesystemCollector struct{ dir string }

var (
	descDiskAvail = prometheus.NewDesc("tollgate_data_dir_filesystem_avail_bytes", "Bytes available to this process on the filesystem holding the data dir.", nil, nil)
	descDiskSize  = prometheus.NewDesc("tollgate_data_dir_filesystem_size_bytes", "Size in bytes of the filesystem holding the data dir.", nil, nil)
)

func (c filesystemCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDiskAvail
	ch <- descDiskSize
}

func (c filesystemCollector) Collect(ch chan<- prometheus.Metric) {
	avail, size, err := datadir.FilesystemUsage(c.dir)
	if err != nil {
		// Not measurable here (or the dir vanished): no sample, rather than a
		// zero that would read as a full disk.
		return
	}
	ch <- prometheus.MustNewConstMetric(descDiskAvail, prometheus.GaugeValue, float64(avail))
	ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(size))
}

// certCollector exports when the node's certificates expire: an expired
// certificate stops raft and client traffic at once, so it must be seen weeks
// ahead. Nothing is exported for a listener without TLS.
type certCollector struct{ cfg TLSConfig }

var descCertExpiry = prometheus.NewDesc("tollgate_tls_certificate_expiry_timestamp_seconds",
	"When the certificate this node presents expires (Unix time), by use: grpc, http, raft.", []string{"use"}, nil)

func (c certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCertExpiry }

func (c certCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range []struct {
		use string
		cfg *tls.Config
	}{{"grpc", c.cfg.GRPC}, {"http", c.cfg.HTTP}, {"raft", c.cfg.RaftServer}} {
		if u.cfg == nil || len(u.cfg.Certificates) == 0 || len(u.cfg.Certificates[0].Certificate) == 0 {
			continue
		}
		leaf := u.cfg.Certificates[0].Leaf
		if leaf == nil {
			var err error
			if leaf, err = x509.ParseCertificate(u.cfg.Certificates[0].Certificate[0]); err != nil {
				continue
			}
		}
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(leaf.NotAfter.Unix()), u.use)
	}
}
