package server

import (
	"context"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
)

// Movable shares (service/shares.Node) on this node: the limits and usage
// they read, and the Shares gRPC service behind the admin rule.

// Share modes (Config.Shares.Mode): see sharessvc.ModeMovable and ModeStatic.
const (
	ShareMovable = sharessvc.ModeMovable
	ShareStatic  = sharessvc.ModeStatic
)

// TenantShares is one group's view of a tenant's share, for status pages.
type TenantShares = sharessvc.TenantShares

func (s *Server) newShares() (*sharessvc.Node, error) {
	return sharessvc.NewNode(sharessvc.NodeConfig{
		Port:       nodePort{s},
		Partitions: s.cfg.Layout.Partitions,
		Groups:     s.cfg.Layout.Groups,
		Base:       s.base,
		Mode:       s.cfg.Shares.Mode,
		Limit: func(g int, tenant string) (int64, uint64) {
			l := s.groupLimits(g)
			var v uint64
			if l.doc != nil {
				v = l.doc.Version
			}
			return l.For(tenant).MaxSeries, v
		},
		Fixed: func(g int, tenant string) int64 {
			lo, hi := layout.GroupSpan(g, s.cfg.Layout.Partitions, s.base)
			return GroupShare(s.groupLimits(g).For(tenant).MaxSeries, hi-lo, s.cfg.Layout.Partitions)
		},
		Usage:     func(g int, t string) (int64, int64) { return s.fsms[g].TenantUsage(t) },
		Exclusive: func(g int, fn func() error) error { return s.trackers[g].t.Exclusive(fn) },
		VersionGate: func(g, version int) sharessvc.Gate {
			switch s.versionGate(g, version) {
			case gateOpen:
				return sharessvc.GateOpen
			case gateClosed:
				return sharessvc.GateClosed
			}
			return sharessvc.GateUnknown
		},
		TenantShares: s.tenantSharesRPC,
		Logger:       s.log,
		Registerer:   s.metrics.reg,
	})
}

type sharesService struct {
	api.UnimplementedSharesServer
	s *Server
}

// authorize applies the admin rule: a forged Receive could raise a share.
func (sv *sharesService) authorize(ctx context.Context) error {
	if isNodeCall(ctx) || sv.s.creds != nil {
		// A node's own call, or the interceptor applied the rule table
		// (Shares needs the admin scope, rules.go).
		return nil
	}
	var remote net.IP
	if p, ok := peer.FromContext(ctx); ok {
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			remote = tcp.IP
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	switch sv.s.adminVerdictFor(remote, md.Get("authorization")) {
	case adminNotLoopback:
		return status.Error(codes.PermissionDenied, "shares API: no admin token is configured on this node, so only loopback peers may call it")
	case adminBadToken:
		return status.Error(codes.Unauthenticated, "shares API: missing or wrong token")
	}
	return nil
}

func (sv *sharesService) Give(ctx context.Context, in *api.GiveRequest) (*api.GiveResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.s.shares.Give(ctx, in)
}

func (sv *sharesService) Receive(ctx context.Context, in *api.ReceiveRequest) (*api.ReceiveResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.s.shares.Receive(ctx, in)
}

func (sv *sharesService) Complete(ctx context.Context, in *api.CompleteRequest) (*api.CompleteResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.s.shares.Complete(ctx, in)
}

func (sv *sharesService) Cover(ctx context.Context, in *api.CoverRequest) (*api.CoverResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.s.shares.Cover(ctx, in)
}

// TenantShares serves `tollgate status --tenant T` from this node's replicas.
// Reading needs no leader and no movable mode (static shows the fixed split).
func (sv *sharesService) TenantShares(ctx context.Context, in *api.TenantSharesRequest) (*api.TenantSharesResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.s.tenantSharesRPC(in)
}

func (s *Server) tenantSharesRPC(in *api.TenantSharesRequest) (*api.TenantSharesResponse, error) {
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.KnownTenant(in.Tenant) {
		return nil, status.Errorf(codes.NotFound, "tenant %q is unknown on node %s: it never sent series to the groups this node holds and has no entry in the runtime limits", in.Tenant, s.cfg.Node.ID)
	}
	u := s.Usage(in.Tenant)
	out := &api.TenantSharesResponse{Tenant: in.Tenant, MaxSeries: u.MaxSeries, ShareMode: s.cfg.Shares.Mode, NodeId: s.cfg.Node.ID}
	for g, ts := range u.ShareMoves {
		gs := &api.GroupShare{Group: uint32(g), Base: ts.Base, Delta: ts.Delta, Share: ts.Share, Series: u.PerGroup[g],
			Given: ts.Given, Received: ts.Received, Moves: ts.Moves}
		for _, o := range ts.Outstanding {
			gs.Outstanding = append(gs.Outstanding, &api.ShareTransfer{Seq: o.Seq, To: uint32(o.To), Amount: o.Amount})
		}
		out.Groups = append(out.Groups, gs)
	}
	return out, nil
}
