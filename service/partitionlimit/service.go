package partitionlimit

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// Service serves api.Sketches over a Hub.
type Service struct {
	api.UnimplementedSketchesServer
	h *Hub
	// Closing ends watch streams (Unavailable) when the node stops.
	Closing <-chan struct{}
	// Coalesce is how long a watch stream waits after a change before sending,
	// so a burst of pushes goes out as one batch; 0 = 20ms.
	Coalesce time.Duration
	// MaxBatch caps the sketches of one streamed batch; 0 = 4096.
	MaxBatch int
	// MapError turns a hub error into a gRPC status (the server's error
	// table); nil = Status.
	MapError func(error) error
	// Origin returns the origin a push may claim: claimed when the caller
	// proved it is a node of the cluster, else "" (a client). A client
	// claiming a node's id would otherwise keep its sketches from that
	// node (its cursor skips the pushes of its own origin). nil: origin
	// is always cleared.
	Origin func(ctx context.Context, claimed string) string
}

// NewService returns the gRPC service of h.
func NewService(h *Hub, closing <-chan struct{}) *Service {
	return &Service{h: h, Closing: closing, MapError: Status}
}

// Status maps hub errors to gRPC statuses: refused content → InvalidArgument,
// capacity → ResourceExhausted.
func Status(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, ErrInvalid), errors.Is(err, api.ErrInvalidSketch):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// PushSketches merges a client's or a peer's sketches.
func (s *Service) PushSketches(ctx context.Context, req *api.PushSketchesRequest) (*api.PushSketchesResponse, error) {
	s.h.st.bytesPushed.Add(uint64(proto.Size(req)))
	if req.Origin != "" {
		claimed := req.Origin
		req.Origin = ""
		if s.Origin != nil {
			req.Origin = s.Origin(ctx, claimed)
		}
	}
	changed, err := s.h.Merge(req)
	if err != nil {
		if s.MapError != nil {
			return nil, s.MapError(err)
		}
		return nil, Status(err)
	}
	return &api.PushSketchesResponse{Changed: uint32(changed), NodeMinute: s.h.now(), Incarnation: s.h.incarnation}, nil
}

// MaxSubscribedTenants bounds the tenants one WatchSketches stream names.
const MaxSubscribedTenants = 100_000

// subscription is the tenant set a watch follows (nil: every tenant).
func subscription(req *api.WatchSketchesRequest) (map[string]bool, error) {
	if !req.OnlyTenants {
		if len(req.Tenants) > 0 {
			return nil, status.Error(codes.InvalidArgument, "tenants: set only_tenants to follow only the tenants listed")
		}
		return nil, nil
	}
	if len(req.Tenants) > MaxSubscribedTenants {
		return nil, status.Errorf(codes.InvalidArgument, "tenants: %d listed, at most %d", len(req.Tenants), MaxSubscribedTenants)
	}
	only := make(map[string]bool, len(req.Tenants))
	for i, t := range req.Tenants {
		if err := api.ValidateTenantID(t); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "tenants[%d]: %v", i, err)
		}
		only[t] = true
	}
	return only, nil
}

// WatchSketches sends every sketch (of the tenants the request follows, when
// it names them), then the changed ones, until the client leaves or the node
// stops.
func (s *Service) WatchSketches(req *api.WatchSketchesRequest, stream grpc.ServerStreamingServer[api.SketchBatch]) error {
	h := s.h
	if req.Precision != uint32(h.p) {
		return status.Errorf(codes.InvalidArgument, "precision %d, this node uses %d (every client and node must use the same precision)", req.Precision, h.p)
	}
	coalesce := s.Coalesce
	if coalesce == 0 {
		coalesce = 20 * time.Millisecond
	}
	maxBatch := s.MaxBatch
	if maxBatch == 0 {
		maxBatch = 4096
	}
	only, err := subscription(req)
	if err != nil {
		return err
	}
	c := h.NewTenantCursor("", true, only)
	defer c.Close()
	h.st.subscribers.Add(1)
	defer h.st.subscribers.Add(-1)
	first := true
	for {
		// The first batch is sent even when empty: it tells the client the
		// stream is up and the node holds nothing yet.
		for sk := c.Take(maxBatch); first || len(sk) > 0; sk = c.Take(maxBatch) {
			b := &api.SketchBatch{Precision: uint32(h.p), WindowMinutes: uint32(h.cfg.WindowMinutes), Full: first,
				Sketches: sk, NodeMinute: h.now(), ServedBy: h.cfg.NodeID}
			if err := stream.Send(b); err != nil {
				return err
			}
			h.st.bytesStreamed.Add(uint64(proto.Size(b)))
			first = false
		}
		select {
		case <-c.C():
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-s.Closing:
			return status.Error(codes.Unavailable, "node is shutting down; watch another node")
		}
		select {
		case <-time.After(coalesce):
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}
