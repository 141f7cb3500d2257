package server

import (
	"context"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/service/partitionlimit"
)

// The per-partition sketch hub (service/partitionlimit) on this node: its
// settings, gRPC service, peer exchange over the peer pool, expiry and
// /api/v1/sketches.

// SketchConfig configures the node's sketch hub (partitionlimit.NodeConfig).
type SketchConfig = partitionlimit.NodeConfig

// SketchStatus is /api/v1/sketches.
type SketchStatus = partitionlimit.NodeStatus

// newSketches creates the hub (before the gRPC server registers services).
func (s *Server) newSketches() error {
	c := s.cfg.Sketches
	h, err := partitionlimit.New(partitionlimit.Config{
		NodeID: s.cfg.Node.ID, Precision: c.Precision, WindowMinutes: c.WindowMinutes,
		// The window follows the cluster's median clock (this node's wall
		// clock corrected by its measured offset), so a node whose clock is
		// off, even beyond the bound, keeps the same minutes as its peers
		// and as clients with correct clocks (docs/clocks.md).
		Partitions: c.Partitions, MaxSketches: c.MaxSketches, Clock: s.clock.Wall, Logger: s.log,
		// A tenant has sketches only when it has a per-partition limit.
		TenantKnown: func(t string) bool { return s.TenantLimitsFor(t).MaxSeriesPerPartition > 0 },
	})
	if err != nil {
		return err
	}
	s.sketches = h
	s.metrics.reg.MustRegister(h.Collector())
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
	go func() { defer s.wg.Done(); s.sketches.RunExpiry(ctx) }()
}

// sketchPeers lists the other alive members with a gRPC address.
func (s *Server) sketchPeers() []partitionlimit.Peer {
	var out []partitionlimit.Peer
	for _, m := range s.memberList() {
		if m.ID != s.cfg.Node.ID && m.Status == membership.StatusAlive && m.GRPCAddr != "" {
			out = append(out, partitionlimit.Peer{ID: m.ID, Addr: m.GRPCAddr})
		}
	}
	return out
}

// Sketches exposes the node's sketch hub (tests, status).
func (s *Server) Sketches() *partitionlimit.Hub { return s.sketches }
