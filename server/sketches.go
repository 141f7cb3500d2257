package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/httpjson"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
)

// This file wires package service/partitionlimit (per-partition HyperLogLog sketches,
// ) into the node: the Sketches gRPC service, the peer exchange over
// the peer pool, the expiry ticker, metrics and /api/v1/sketches.

// SketchConfig configures the node's sketch hub. Zero values take defaults.
type SketchConfig struct {
	Precision     int           // HLL precision 4..18; default 11 (clients must match)
	WindowMinutes int           // sliding window; default 20 (clients must match)
	Partitions    int           // ingest partitions accepted, [0, n); default 4096
	MaxSketches   int           // (tenant, partition, minute) sketches held at most; default 1,000,000
	PeerInterval  time.Duration // how often changes go to peers; default 200ms
}

func (c *SketchConfig) validate() error {
	if c.Precision == 0 {
		c.Precision = api.DefaultHLLPrecision
	}
	if err := api.ValidateHLLPrecision(c.Precision); err != nil {
		return fmt.Errorf("config: sketch %w", err)
	}
	if c.WindowMinutes == 0 {
		c.WindowMinutes = partitionlimit.DefaultWindowMinutes
	}
	if c.Partitions == 0 {
		c.Partitions = partitionlimit.DefaultPartitions
	}
	if c.MaxSketches == 0 {
		c.MaxSketches = partitionlimit.DefaultMaxSketches
	}
	if c.PeerInterval == 0 {
		c.PeerInterval = 200 * time.Millisecond
	}
	if c.WindowMinutes < 1 || c.WindowMinutes > 1440 || c.Partitions < 1 || c.MaxSketches < 1 || c.PeerInterval < 0 {
		return fmt.Errorf("config: sketch window %d (1..1440 minutes), partitions %d, max sketches %d (≥ 1), peer interval %v (> 0)",
			c.WindowMinutes, c.Partitions, c.MaxSketches, c.PeerInterval)
	}
	return nil
}

// newSketches creates the hub (before the gRPC server registers services).
func (s *Server) newSketches() error {
	c := s.cfg.Sketches
	h, err := partitionlimit.New(partitionlimit.Config{
		NodeID: s.cfg.NodeID, Precision: c.Precision, WindowMinutes: c.WindowMinutes,
		// The window follows the cluster's median clock (this node's wall
		// clock corrected by its measured offset), so a node whose clock is
		// off, even beyond the bound, keeps the same minutes as its peers
		// and as clients with correct clocks (docs/clocks.md).
		Partitions: c.Partitions, MaxSketches: c.MaxSketches, Clock: s.clock.wall, Logger: s.log,
		// A tenant has sketches only when it has a per-partition limit.
		TenantKnown: func(t string) bool { return s.TenantLimitsFor(t).MaxSeriesPerPartition > 0 },
	})
	if err != nil {
		return err
	}
	s.sketches = h
	s.metrics.reg.MustRegister(&sketchCollector{h: h})
	return nil
}

func (s *Server) registerSketches(g *grpc.Server) {
	svc := partitionlimit.NewService(s.sketches, s.closing)
	svc.MapError = grpcError
	svc.Origin = func(ctx context.Context, claimed string) string {
		if s.callerIsNode(ctx) {
			return claimed
		}
		return "" // a client's push, whatever it claims
	}
	api.RegisterSketchesServer(g, svc)
}

// startSketchLoops runs the peer exchange and the expiry of old minutes.
func (s *Server) startSketchLoops() {
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(3)
	go func() { defer s.wg.Done(); <-s.stop; cancel() }()
	go func() {
		defer s.wg.Done()
		s.sketches.RunPeers(ctx, partitionlimit.PeerConfig{
			Peers:    s.sketchPeers,
			Dial:     func(addr string) (grpc.ClientConnInterface, error) { return s.admin.conn(addr) },
			Interval: s.cfg.Sketches.PeerInterval,
		})
	}()
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.sketches.Expire()
			}
		}
	}()
}

// sketchPeers lists the other alive members with a gRPC address.
func (s *Server) sketchPeers() []partitionlimit.Peer {
	var out []partitionlimit.Peer
	for _, m := range s.memberList() {
		if m.ID != s.cfg.NodeID && m.Status == membership.StatusAlive && m.GRPCAddr != "" {
			out = append(out, partitionlimit.Peer{ID: m.ID, Addr: m.GRPCAddr})
		}
	}
	return out
}

// SketchStatus is /api/v1/sketches: the hub's counters and the largest
// per-partition estimates (?top=N, default 20).
type SketchStatus struct {
	Node  string                             `json:"node"`
	Stats partitionlimit.Stats               `json:"stats"`
	Top   []partitionlimit.PartitionEstimate `json:"top_partitions"`
}

func (s *Server) handleSketches(w http.ResponseWriter, r *http.Request) {
	n := 20
	q, e := httpjson.Query(r)
	if e != nil {
		httpjson.WriteErr(w, e)
		return
	}
	if v := q.Get("top"); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x < 1 || x > 10_000 {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("top=%q: want an integer in [1, 10000]", v))
			return
		}
		n = x
	}
	s.writeJSON(w, SketchStatus{Node: s.cfg.NodeID, Stats: s.sketches.Stats(), Top: s.sketches.Top(n)})
}

// Sketches exposes the node's sketch hub (tests, status).
func (s *Server) Sketches() *partitionlimit.Hub { return s.sketches }

// sketchCollector exports the hub's counters at scrape time.
type sketchCollector struct{ h *partitionlimit.Hub }

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
