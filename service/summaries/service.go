package summaries

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Service implements api.SummariesServer on a Hub.
type Service struct {
	api.UnimplementedSummariesServer
	hub     *Hub
	closing <-chan struct{}
}

// NewService serves hub's updates; streams end with Unavailable once closing
// is closed (before a graceful gRPC stop, which waits for streams to end).
func NewService(hub *Hub, closing <-chan struct{}) *Service {
	return &Service{hub: hub, closing: closing}
}

// WatchSummaries subscribes and forwards the hub's updates until the client
// goes away, the hub drops the subscriber, or the node stops.
func (s *Service) WatchSummaries(req *api.WatchSummariesRequest, stream grpc.ServerStreamingServer[api.SummaryUpdate]) error {
	sub, err := s.hub.Subscribe(req.Groups)
	if err != nil {
		return err
	}
	defer sub.Close()
	ctx := stream.Context()
	for {
		// Updates already queued go out before a drop is reported: the
		// client applies them, then reconnects.
		select {
		case u := <-sub.Updates():
			if err := stream.Send(u); err != nil {
				return err
			}
			continue
		default:
		}
		select {
		case u := <-sub.Updates():
			if err := stream.Send(u); err != nil {
				return err
			}
		case <-sub.Done():
			if err := sub.Err(); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "summary subscription closed; reconnect")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.closing:
			return status.Error(codes.Unavailable, "node is shutting down; reconnect to another node")
		}
	}
}
