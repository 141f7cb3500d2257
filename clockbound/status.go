package clockbound

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
)

// Status is the clock part of /api/v1/status (JSON).
type Status struct {
	MaxOffset    string       `json:"max_offset"`
	MaxOffsetNs  int64        `json:"max_offset_ns"`
	MedianOffset string       `json:"median_offset"` // this node minus the median clock
	MedianNs     int64        `json:"median_offset_ns"`
	InBound      bool         `json:"in_bound"`
	Reason       string       `json:"reason,omitempty"`
	Peers        []PeerStatus `json:"peers"`
}

// PeerStatus is one peer's measured offset.
type PeerStatus struct {
	Node     string `json:"node"`
	Offset   string `json:"offset"` // this node minus the peer
	OffsetNs int64  `json:"offset_ns"`
	RTTNs    int64  `json:"rtt_ns"`
	AgeNs    int64  `json:"age_ns"`
	Error    string `json:"error,omitempty"`
}

// Offsets is this node's view as the Clock.Offsets answer.
func (c *Clock) Offsets() *api.ClockOffsetsResponse {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &api.ClockOffsetsResponse{NodeId: c.cfg.NodeID, MaxOffsetNanos: int64(c.bound), MedianOffsetNanos: int64(c.median),
		InBound: c.inBound, Reason: c.reason, UnixNano: c.cfg.Clock().UnixNano()}
	for _, p := range c.peers {
		po := &api.PeerOffset{NodeId: p.id, GrpcAddress: p.addr, Error: p.lastErr}
		if b, ok := p.best(now); ok {
			po.OffsetNanos, po.RttNanos, po.AgeNanos = int64(b.offset), int64(b.rtt), int64(now.Sub(b.at))
		}
		out.Peers = append(out.Peers, po)
	}
	slices.SortFunc(out.Peers, func(a, b *api.PeerOffset) int {
		switch {
		case a.NodeId < b.NodeId:
			return -1
		case a.NodeId > b.NodeId:
			return 1
		}
		return 0
	})
	return out
}

func (c *Clock) Status() *Status {
	o := c.Offsets()
	st := &Status{MaxOffset: time.Duration(o.MaxOffsetNanos).String(), MaxOffsetNs: o.MaxOffsetNanos,
		MedianOffset: signed(time.Duration(o.MedianOffsetNanos)), MedianNs: o.MedianOffsetNanos, InBound: o.InBound, Reason: o.Reason}
	for _, p := range o.Peers {
		st.Peers = append(st.Peers, PeerStatus{Node: p.NodeId, Offset: signed(time.Duration(p.OffsetNanos)), OffsetNs: p.OffsetNanos,
			RTTNs: p.RttNanos, AgeNs: p.AgeNanos, Error: p.Error})
	}
	return st
}

// Service is the Clock gRPC service of this node: Now answers a peer's
// probe, Offsets shows this node's view.
func (c *Clock) Service() api.ClockServer { return service{c: c} }

type service struct {
	api.UnimplementedClockServer
	c *Clock
}

func (s service) Now(ctx context.Context, _ *api.ClockNowRequest) (*api.ClockNowResponse, error) {
	// Before the answer: a header sent with it costs no extra round trip.
	_ = grpc.SetHeader(ctx, metadata.Pairs(BootHeader, s.c.boot))
	return &api.ClockNowResponse{NodeId: s.c.cfg.NodeID, UnixNano: s.c.cfg.Clock().UnixNano()}, nil
}

func (s service) Offsets(context.Context, *api.ClockOffsetsRequest) (*api.ClockOffsetsResponse, error) {
	return s.c.Offsets(), nil
}
