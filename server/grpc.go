package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/nodeport"
	"github.com/tollgate-io/tollgate/strictcodec"
)

// trackerService implements api.TrackerServer.
type trackerService struct {
	api.UnimplementedTrackerServer
	s *Server
}

// grpcStreamWorkers is the size of the gRPC server's handler pool.
const grpcStreamWorkers = 64

func (s *Server) startGRPC() error {
	lis, err := net.Listen("tcp", s.cfg.Node.GRPCAddr)
	if err != nil {
		return fmt.Errorf("grpc listen %s: %w", s.cfg.Node.GRPCAddr, err)
	}
	s.grpcLis = lis
	s.grpcCap = access.NewGRPCCap(lis, s.cfg.Bounds.GRPCMaxConns, s.cfg.Bounds.GRPCMaxConnsPerPeer)
	s.streams = access.NewStreamBounds(s.cfg.Bounds, s.metrics.streamsRefused, s.metrics.streamsSlow, s.log)
	opts := append(strictcodec.New().ServerOptions(), // undecodable input → InvalidArgument
		grpc.ChainUnaryInterceptor(s.recoverInterceptor, s.guard.Unary, s.metricsInterceptor),
		grpc.ChainStreamInterceptor(s.recoverStream, s.guard.Stream, s.streams.Intercept),
		grpc.MaxRecvMsgSize(max(16+s.cfg.Tracking.MaxHashesPerRequest*8+1024, 2*snapshotChunkSize)),
		s.grpcCreds(), // TLS when configured (tls.go)
	)
	s.metrics.reg.MustRegister(s.grpcCap.Collectors()...)
	// Authentication before messages (access.Guard.Tap), the busy marks of
	// the connection cap, the connection bounds.
	opts = append(opts, grpc.InTapHandle(s.guard.Tap), grpc.StatsHandler(s.grpcCap.StatsHandler()))
	// Handlers run on a pool of long-lived workers instead of a goroutine
	// per call: a fresh goroutine grows its stack on every call (about 13 %
	// of a node's CPU under Envoy load went to stack growth), a worker's
	// stack stays grown. 64 because with one per core the workers are all
	// busy and gRPC falls back to a goroutine per call; BENCHMARKS.md has
	// the figures (decisions per CPU-second 1.23× in rotated rounds).
	opts = append(opts, grpc.NumStreamWorkers(grpcStreamWorkers))
	s.grpc = grpc.NewServer(append(opts, s.cfg.Bounds.GRPCOptions()...)...)
	// The node's calls to peers carry its node credential (nodeauth.go),
	// never the admin token.
	s.peers = nodeport.NewPool(s.peerCredentials(), s.nodeKeys)
	s.admin = newAdminService(s)
	for _, c := range s.comps { // components.go
		if c.grpc == nil {
			continue
		}
		if err := c.grpc(s.grpc); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	s.metrics.initMethods(s.grpc.GetServiceInfo())
	go func() {
		if err := s.grpc.Serve(s.grpcCap); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("grpc server stopped", "err", err)
		}
	}()
	return nil
}

// recoverInterceptor turns a handler panic into codes.Internal: a bug must not take
// down every group this node hosts.
func (s *Server) recoverInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in grpc handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	return h(ctx, req)
}

func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in grpc stream handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	return h(srv, ss)
}

func (s *Server) metricsInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	s.metrics.requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	s.metrics.requestDur.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
	return resp, err
}

// validateTrack checks a request and returns its group.
func (s *Server) validateTrack(req *api.TrackSeriesRequest) (int, error) {
	if err := api.ValidateTenantID(req.Tenant); err != nil {
		return 0, status.Error(codes.InvalidArgument, err.Error())
	}
	p := int(req.Partition)
	if p >= s.cfg.Layout.Partitions {
		return 0, status.Errorf(codes.InvalidArgument, "partition %d out of range: this cluster has %d partitions", req.Partition, s.cfg.Layout.Partitions)
	}
	if n := len(req.Hashes); n > s.cfg.Tracking.MaxHashesPerRequest {
		return 0, status.Errorf(codes.InvalidArgument, "%d hashes in one request, at most %d allowed; split the request", n, s.cfg.Tracking.MaxHashesPerRequest)
	}
	for i, h := range req.Hashes {
		if hp := api.Partition(h, s.cfg.Layout.Partitions); hp != p {
			return 0, status.Errorf(codes.InvalidArgument, "hash %d (%#016x) belongs to partition %d, not %d: compute partitions with api.Partition(hash, %d)", i, h, hp, p, s.cfg.Layout.Partitions)
		}
	}
	g, err := s.layout.Route(p, req.Group) // layout.go
	if err == nil && !s.servesGroup(g) {
		// A group a raise added that this node is still creating
		// (groups.go): a moment, or the group's leader elsewhere.
		return 0, status.Errorf(codes.Unavailable, "group %d: node %s does not serve it yet (a raise added it and the node is still creating its state); retry at the group's leader", g, s.cfg.Node.ID)
	}
	return g, err
}

func (t *trackerService) TrackSeries(ctx context.Context, req *api.TrackSeriesRequest) (*api.TrackSeriesResponse, error) {
	s := t.s
	g, err := s.validateTrack(req)
	if err != nil {
		return nil, err
	}
	if len(req.Hashes) == 0 {
		return &api.TrackSeriesResponse{}, nil
	}
	rejected, err := s.trackers[g].track(ctx, req.Tenant, req.Hashes)
	if err != nil {
		return nil, s.trackError(g, err)
	}
	return &api.TrackSeriesResponse{RejectedHashes: rejected}, nil
}

func (t *trackerService) GetUsersCloseToLimit(ctx context.Context, req *api.GetUsersCloseToLimitRequest) (*api.GetUsersCloseToLimitResponse, error) {
	s := t.s
	if int(req.Partition) >= s.cfg.Layout.Partitions {
		return nil, status.Errorf(codes.InvalidArgument, "partition %d out of range: this cluster has %d partitions", req.Partition, s.cfg.Layout.Partitions)
	}
	g := s.ownerOf(int(req.Partition))
	if !s.servesGroup(g) || !s.hostsGroup(g) {
		// This node holds no replica of the group (clusters with more nodes
		// than voters per group): ask the leader, once.
		cc, fctx, err := nodePort{s}.LeaderConn(ctx, g)
		if err != nil {
			return nil, err
		}
		return api.NewTrackerClient(cc).GetUsersCloseToLimit(fctx, req)
	}
	return &api.GetUsersCloseToLimitResponse{Tenants: s.closeToLimit(g), Group: uint32(g)}, nil
}

// nearShare reports whether a tenant's active series in a group are at or
// above NearLimitFraction of the group's current share of its max_series
// (share, from groupShares). With the static split that is the fixed split;
// with movable shares it is the split plus the headroom moved in or out, the
// share the group actually decides by: a group with slack rejects nothing
// and a client may track there asynchronously, while a group near its
// current share may have to borrow and rejects once the tenant is at its
// limit, so clients go synchronous there. A share of 0 is unlimited.
func (s *Server) nearShare(active, share int64) bool {
	switch {
	case share == 0:
		return false
	case share < 0: // limited, no headroom at all
		return active > 0
	}
	return float64(active) >= s.cfg.Summaries.NearLimitFraction*float64(share)
}

// groupShares returns group g's current share function (shares.go).
func (s *Server) groupShares(g int) func(tenant string) int64 {
	return s.shares.Share(g)
}

// closeToLimit lists tenants at or above NearLimitFraction of their group
// share, read from this replica's committed state (followers answer too).
func (s *Server) closeToLimit(g int) []string {
	share := s.groupShares(g)
	var out []string
	for _, t := range s.fsms[g].Tenants() {
		if s.nearShare(t.Active(), share(t.Name)) {
			out = append(out, t.Name)
		}
	}
	slices.Sort(out)
	return out
}

// WatchCluster sends the current view, then every changed view, until the
// client goes away or the node stops. The runtime config travels once per
// version on a stream: a view whose config version this stream already
// carried is sent without it (clients keep the config they hold when a view
// has none), and a stream that asked for deltas gets a new version as what
// changed since the previous one it carried (runtime_config_delta) — so after
// the first message a stream's bytes grow with the changes, not with the
// number of tenants.
func (t *trackerService) WatchCluster(req *api.WatchClusterRequest, stream grpc.ServerStreamingServer[api.ClusterView]) error {
	s := t.s
	var sent, sentConfig uint64
	for {
		v, full, bare, changed := s.view.getEncoded()
		if v != nil && v.Version != sent {
			withConfig := v.RuntimeConfig != nil && v.ConfigVersion != sentConfig
			var enc [][]byte
			if bare != nil {
				enc = [][]byte{bare}
			}
			if withConfig {
				enc = full
				if req.GetConfigDeltas() && sentConfig != 0 && bare != nil {
					if d := s.viewConfigDelta(v, sentConfig); d != nil {
						enc = [][]byte{bare, d} // both shared: no copy
					}
				}
			}
			var err error
			switch {
			case enc != nil:
				err = stream.SendMsg(&strictcodec.Shared{Parts: enc})
			case withConfig:
				err = stream.Send(v)
			default:
				m := proto.Clone(v).(*api.ClusterView)
				m.RuntimeConfig = nil
				err = stream.Send(m)
			}
			if err != nil {
				return err
			}
			sent = v.Version
			if withConfig {
				sentConfig = v.ConfigVersion
			}
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-s.closing:
			return status.Error(codes.Unavailable, "node is shutting down; reconnect to another node")
		}
	}
}
