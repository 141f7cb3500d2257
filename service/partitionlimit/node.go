package partitionlimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/httpjson"
)

// What a node adds around the hub: its settings, the expiry ticker, the
// metrics and /api/v1/sketches.

// NodeConfig is a node's sketch settings (server.Config.Sketches). Zero
// values take defaults.
type NodeConfig struct {
	Precision     int           // HLL precision 4..18; default 11 (clients must match)
	WindowMinutes int           // sliding window; default 20 (clients must match)
	Partitions    int           // ingest partitions accepted, [0, n); default 4096
	MaxSketches   int           // (tenant, partition, minute) sketches held at most; default 1,000,000
	PeerInterval  time.Duration // how often changes go to peers; default 200ms
}

// Validate fills defaults and checks ranges; errors name the setting.
func (c *NodeConfig) Validate() error {
	// The hub's own rules (Config.validate) fill and check the settings
	// both share; only the peer interval is the node's.
	hc := Config{Precision: c.Precision, WindowMinutes: c.WindowMinutes, Partitions: c.Partitions, MaxSketches: c.MaxSketches}
	if err := hc.validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	c.Precision, c.WindowMinutes, c.Partitions, c.MaxSketches = hc.Precision, hc.WindowMinutes, hc.Partitions, hc.MaxSketches
	if c.PeerInterval == 0 {
		c.PeerInterval = 200 * time.Millisecond
	}
	if c.PeerInterval < 0 {
		return fmt.Errorf("config: sketches: peer interval %v: must be > 0", c.PeerInterval)
	}
	return nil
}

// RunExpiry drops minutes that left the window, every second until ctx
// ends.
func (h *Hub) RunExpiry(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Expire()
		}
	}
}

// NodeStatus is /api/v1/sketches: the hub's counters and the largest
// per-partition estimates (?top=N, default 20).
type NodeStatus struct {
	Node  string              `json:"node"`
	Stats Stats               `json:"stats"`
	Top   []PartitionEstimate `json:"top_partitions"`
}

// Handler serves /api/v1/sketches for node nodeID.
func (h *Hub) Handler(nodeID string, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { h.serveStatus(w, r, nodeID, log) }
}

func (h *Hub) serveStatus(w http.ResponseWriter, r *http.Request, nodeID string, log *slog.Logger) {
	n := 20
	q, e := httpjson.Query(r)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	if v := q.Get("top"); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x < 1 || x > 10_000 {
			httpjson.WriteError(w, http.StatusBadRequest, fmt.Sprintf("top=%q: want an integer in [1, 10000]", v))
			return
		}
		n = x
	}
	httpjson.Write(w, log, http.StatusOK, NodeStatus{Node: nodeID, Stats: h.Stats(), Top: h.Top(n)})
}

// Collector exports the hub's counters at scrape time.
func (h *Hub) Collector() prometheus.Collector { return &sketchCollector{h: h} }

type sketchCollector struct{ h *Hub }

var (
	sketchHeldDesc      = prometheus.NewDesc("tollgate_sketches_held", "(tenant, partition, minute) HLL sketches held by this node, by encoding.", []string{"encoding"}, nil)
	sketchMaxDesc       = prometheus.NewDesc("tollgate_sketches_max", "Most sketches this node holds (--sketch-max).", nil, nil)
	sketchSubsDesc      = prometheus.NewDesc("tollgate_sketch_subscribers", "Open WatchSketches streams.", nil, nil)
	sketchMergesDesc    = prometheus.NewDesc("tollgate_sketch_merges_total", "Sketches merged from pushes (clients and peers).", nil, nil)
	sketchChangedDesc   = prometheus.NewDesc("tollgate_sketch_changed_total", "Merged sketches whose registers rose.", nil, nil)
	sketchExpiredDesc   = prometheus.NewDesc("tollgate_sketch_expired_total", "Sketches dropped because their minute left the window.", nil, nil)
	sketchBytesDesc     = prometheus.NewDesc("tollgate_sketch_bytes_total", "Protobuf bytes: pushed to this node, streamed to watchers, sent to peers.", []string{"direction"}, nil)
	sketchRejectedDesc  = prometheus.NewDesc("tollgate_sketch_pushes_rejected_total", "Pushes refused whole, by reason.", []string{"reason"}, nil)
	sketchPeerErrorDesc = prometheus.NewDesc("tollgate_sketch_peer_errors_total", "Failed sends of sketches to peers.", nil, nil)
)

func (c *sketchCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sketchHeldDesc, sketchMaxDesc, sketchSubsDesc, sketchMergesDesc, sketchChangedDesc,
		sketchExpiredDesc, sketchBytesDesc, sketchRejectedDesc, sketchPeerErrorDesc} {
		ch <- d
	}
}

func (c *sketchCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.h.Stats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(sketchHeldDesc, g, float64(st.SparseSketches), "sparse")
	ch <- prometheus.MustNewConstMetric(sketchHeldDesc, g, float64(st.Sketches-st.SparseSketches), "dense")
	ch <- prometheus.MustNewConstMetric(sketchMaxDesc, g, float64(st.MaxSketches))
	ch <- prometheus.MustNewConstMetric(sketchSubsDesc, g, float64(st.Subscribers))
	ch <- prometheus.MustNewConstMetric(sketchMergesDesc, ctr, float64(st.Merges))
	ch <- prometheus.MustNewConstMetric(sketchChangedDesc, ctr, float64(st.Changed))
	ch <- prometheus.MustNewConstMetric(sketchExpiredDesc, ctr, float64(st.Expired))
	ch <- prometheus.MustNewConstMetric(sketchBytesDesc, ctr, float64(st.BytesPushed), "pushed")
	ch <- prometheus.MustNewConstMetric(sketchBytesDesc, ctr, float64(st.BytesStreamed), "streamed")
	ch <- prometheus.MustNewConstMetric(sketchBytesDesc, ctr, float64(st.BytesToPeers), "peers")
	ch <- prometheus.MustNewConstMetric(sketchRejectedDesc, ctr, float64(st.RejectedInvalid), "invalid")
	ch <- prometheus.MustNewConstMetric(sketchRejectedDesc, ctr, float64(st.RejectedFull), "full")
	ch <- prometheus.MustNewConstMetric(sketchPeerErrorDesc, ctr, float64(st.PeerErrors))
}
