package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/shares"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
)

// Share modes (Config.ShareMode).
const (
	// ShareMovable (the default): each group's share of a tenant's
	// max_series starts at an exact split and headroom moves between groups
	// on demand (service/shares), so max_series holds per tenant.
	ShareMovable = "movable"
	// ShareStatic: the fixed split ceil(max_series × partitions_in_group / P)
	// of earlier builds; nothing moves. Kept selectable (--share-mode static)
	// for clusters that ran it and as the benchmark baseline. Headroom that
	// movable leaders moved before (a switch of modes) is honoured: share =
	// fixed + delta.
	ShareStatic = "static"
)

// shareState wires fsm/shares and service/shares into the node.
type shareState struct {
	nodePort // sharessvc.Host's node half: leadership, proposals, the leader's connection
	s        *Server
	mods     []*shares.Module
	mover    *sharessvc.Mover
	metrics  *shareMetrics
	movesOK  []movesCheck // per group (moveGate)
	born     time.Time    // when this node started (moveGate's grace)
}

// versionsGrace bounds how long after its start a node treats a server
// missing from its member list as "not heard of yet" (moveGate's
// gateUnknown): gossip converges within seconds of a restart, and a server
// missing for longer was reaped or never joined, which the static rule
// covers as before.
const versionsGrace = 30 * time.Second

// movesCheck caches a group's share-move gate (moveGate).
type movesCheck struct {
	at   atomic.Int64 // UnixNano of the last check; 0: never
	gate atomic.Uint32
}

// shareMoveEntry is the first share-move entry type (shares-give): the
// cluster version it needs is the one movable shares need.
const shareMoveEntry = 8

// moveGate says whether group g can take share-move entries: gateOpen when
// every server of the group supports their cluster version. During a rolling
// upgrade from a build without movable shares (gateClosed) the group decides
// by the static rule (its share, no borrow, no cover) as that build did,
// instead of refusing new series until the upgrade ends. gateUnknown: a
// server's version is not known yet (this leader restarted and has not
// heard its peers' gossip): the group decides by the static rule too, but a
// series refused at its share is a retryable error, not a rejection (the
// other groups may well have headroom for it), unless the group has applied
// a share-move entry already (its servers could all apply one then, and
// still can: downgrades are unsupported), and only for versionsGrace after
// the node's start. Checked at most once a second per
// group (the check reads the raft configuration).
func (st *shareState) moveGate(g int) gate {
	c := &st.movesOK[g]
	now := time.Now().UnixNano()
	if at := c.at.Load(); at != 0 && now-at < int64(time.Second) {
		return gate(c.gate.Load())
	}
	info, _ := fsm.LookupEntryType(shareMoveEntry)
	gt := st.s.versionGate(g, info.Since)
	switch {
	case gt != gateUnknown:
	case st.mods[g].MovesApplied():
		gt = gateOpen
	case time.Since(st.born) > versionsGrace:
		gt = gateClosed
	}
	c.gate.Store(uint32(gt))
	c.at.Store(now)
	return gt
}

type shareMetrics struct {
	moves      *prometheus.CounterVec
	moved      prometheus.Counter
	recovered  prometheus.Counter
	rejections *prometheus.CounterVec
	borrow     prometheus.Histogram
}

func newShareState(s *Server) (*shareState, error) {
	st := &shareState{nodePort: nodePort{s}, s: s, mods: make([]*shares.Module, s.cfg.Groups), movesOK: make([]movesCheck, s.cfg.Groups), born: time.Now()}
	for g := range st.mods {
		m, err := shares.New(g, s.cfg.Groups)
		if err != nil {
			return nil, err
		}
		st.mods[g] = m
	}
	st.metrics = &shareMetrics{
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_share_moves_total",
			Help: "Headroom transfers received by groups led here, by giver and receiver group."}, []string{"giver", "receiver"}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_share_moved_series_total",
			Help: "Series of headroom moved into groups led here."}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_share_stranded_recovered_series_total",
			Help: "Series of headroom stranded between a give and its receive (a crash) and delivered by the giver's re-drive."}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_share_rejections_total",
			Help: "New series rejected for a tenant's max_series: at=share for a group's fixed share (static mode; other groups may have had headroom), at=limit when every group answered it had none (movable mode)."}, []string{"at"}),
		borrow: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_share_borrow_seconds",
			Help: "Duration of a synchronous headroom borrow.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	s.metrics.reg.MustRegister(st.metrics.moves, st.metrics.moved, st.metrics.recovered, st.metrics.rejections, st.metrics.borrow)
	st.metrics.rejections.WithLabelValues("share") // at zero from the start (see initGroups)
	st.metrics.rejections.WithLabelValues("limit")
	if s.cfg.ShareMode == ShareMovable {
		st.mover = sharessvc.New(st, s.log, st.metrics)
	}
	return st, nil
}

func (st *shareState) fsmModules(g int) []fsm.Module { return []fsm.Module{st.mods[g]} }

// share returns group g's admission share function.
func (st *shareState) share(g, partitionsInGroup int) func(tenant string) int64 {
	s := st.s
	if s.cfg.ShareMode == ShareStatic {
		return func(tenant string) int64 {
			fixed := GroupShare(s.groupLimits(g).For(tenant).MaxSeries, partitionsInGroup, s.cfg.Partitions)
			if fixed == 0 {
				return 0 // unlimited
			}
			// Headroom moved while a movable node led this group stays
			// moved: a cluster switching modes node by node has static and
			// movable leaders at once, and a static leader that ignored what
			// its group gave away would let the receiver and itself both
			// use it. With it, Σ shares ≤ Σ fixed + Σ delta ≤ Σ fixed. A
			// cluster that never ran movable has delta 0 everywhere.
			delta, _ := st.mods[g].Delta(tenant)
			if v := fixed + delta; v > 0 {
				return v
			}
			return admission.NoHeadroom
		}
	}
	return func(tenant string) int64 {
		delta, res := st.mods[g].Delta(tenant)
		return sharessvc.Share(s.groupLimits(g).For(tenant).MaxSeries, st.Base(g, tenant), delta, res)
	}
}

// admitShare is group g's share function for admission: share, except that
// in movable mode a tenant this leader session has not settled since its
// limit last changed gets no headroom for new series (Mover.Admit settles it
// before deciding; refreshes never depend on it). Near-limit lists and
// status pages use share.
func (st *shareState) admitShare(g, partitionsInGroup int) func(tenant string) int64 {
	share := st.share(g, partitionsInGroup)
	if st.mover == nil {
		return share
	}
	return func(tenant string) int64 {
		if !st.mover.Settled(g, tenant) && st.moveGate(g) != gateClosed {
			return admission.NoHeadroom
		}
		return share(tenant)
	}
}

// track decides a request in group g. In movable mode, series refused only
// for the group's share make the mover borrow headroom from the other groups
// and decide them again: a rejection then means every group answered that it
// has none (at="limit"), and a borrow that cannot establish that (a group
// has no leader) is an Unavailable error, never a rejection below the limit.
// In static mode nothing moves and a share rejection is counted at="share";
// so it is while a rolling upgrade keeps share moves off (moveGate).
func (st *shareState) track(ctx context.Context, g int, t *admission.Tracker, tenant string, hashes []uint64) ([]uint64, error) {
	gt := gateOpen
	if st.mover != nil {
		gt = st.moveGate(g)
	}
	if st.mover == nil || gt != gateOpen {
		rejected, atShare, err := t.TrackAtShare(ctx, tenant, hashes)
		if err == nil && atShare > 0 {
			if gt == gateUnknown {
				// The accepted ones are committed; a retry refreshes them.
				return nil, fmt.Errorf("%d series of tenant %s refused at the group's share while this leader does not know its peers' versions yet (it just started; share moves wait for them): %w",
					atShare, tenant, sharessvc.ErrHeadroomUnreachable)
			}
			st.metrics.rejections.WithLabelValues("share").Add(float64(atShare))
		}
		return rejected, err
	}
	rejected, atLimit, err := st.mover.Admit(ctx, g, tenant, hashes, func(ctx context.Context, hs []uint64) ([]uint64, int, error) {
		return t.TrackAtShare(ctx, tenant, hs)
	})
	if err == nil && atLimit > 0 {
		st.metrics.rejections.WithLabelValues("limit").Add(float64(atLimit))
	}
	return rejected, err
}

// --- sharessvc.Host ---

func (st *shareState) Module(g int) *shares.Module          { return st.mods[g] }
func (st *shareState) Usage(g int, t string) (int64, int64) { return st.s.fsms[g].TenantUsage(t) }

func (st *shareState) Base(g int, tenant string) int64 {
	lo, hi := api.GroupRange(g, st.s.cfg.Partitions, st.s.cfg.Groups)
	return shares.Split(st.s.groupLimits(g).For(tenant).MaxSeries, lo, hi, st.s.cfg.Partitions)
}

func (st *shareState) Limit(g int, tenant string) (int64, uint64) {
	l := st.s.groupLimits(g)
	var v uint64
	if l.doc != nil {
		v = l.doc.Version
	}
	return l.For(tenant).MaxSeries, v
}

func (st *shareState) Exclusive(g int, fn func() error) error {
	err := st.s.trackers[g].t.Exclusive(fn)
	if errors.Is(err, admission.ErrNotLeader) {
		return sharessvc.ErrNotLeader
	}
	return err
}

// Peer is a client for group g's shares service: this node's own when it
// leads g, else the leader's (nodeport: the mover calls for the node, so the
// pool's calls carry the node's token).
func (st *shareState) Peer(ctx context.Context, g int) (api.SharesClient, error) {
	if st.Leads(g) {
		return localShares{st}, nil
	}
	cc, _, err := st.LeaderConn(forward.Own(ctx), g)
	if err != nil {
		return nil, err
	}
	return api.NewSharesClient(cc), nil
}

// localShares serves a call for a group this node leads without a network hop.
type localShares struct{ st *shareState }

func (l localShares) Give(ctx context.Context, in *api.GiveRequest, _ ...grpc.CallOption) (*api.GiveResponse, error) {
	return l.st.give(ctx, in)
}
func (l localShares) Receive(ctx context.Context, in *api.ReceiveRequest, _ ...grpc.CallOption) (*api.ReceiveResponse, error) {
	return l.st.receive(ctx, in)
}
func (l localShares) TenantShares(_ context.Context, in *api.TenantSharesRequest, _ ...grpc.CallOption) (*api.TenantSharesResponse, error) {
	return l.st.tenantSharesRPC(in)
}
func (l localShares) Complete(ctx context.Context, in *api.CompleteRequest, _ ...grpc.CallOption) (*api.CompleteResponse, error) {
	return l.st.complete(ctx, in)
}
func (l localShares) Cover(ctx context.Context, in *api.CoverRequest, _ ...grpc.CallOption) (*api.CoverResponse, error) {
	return l.st.cover(ctx, in)
}

// --- sharessvc.Metrics ---

func (m *shareMetrics) Moved(giver, receiver int, amount int64) {
	m.moves.WithLabelValues(fmt.Sprint(giver), fmt.Sprint(receiver)).Inc()
	m.moved.Add(float64(amount))
}
func (m *shareMetrics) Recovered(_, _ int, amount int64) { m.recovered.Add(float64(amount)) }
func (m *shareMetrics) Borrow(_ int, _ int64, d time.Duration) {
	m.borrow.Observe(d.Seconds())
}

// --- gRPC service ---

type sharesService struct {
	api.UnimplementedSharesServer
	st *shareState
}

func (st *shareState) moverOrErr() (*sharessvc.Mover, error) {
	if st.mover == nil {
		return nil, status.Error(codes.FailedPrecondition, "shares: this node runs with share mode static; headroom does not move")
	}
	return st.mover, nil
}

func shareErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, sharessvc.ErrNotLeader) {
		return status.Errorf(codes.Unavailable, "shares: %v; retry at the group's leader", err)
	}
	return status.Errorf(codes.InvalidArgument, "shares: %v", err)
}

func (st *shareState) give(ctx context.Context, in *api.GiveRequest) (*api.GiveResponse, error) {
	m, err := st.moverOrErr()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	amt, seq, reason, err := m.Give(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Want)
	if err != nil {
		return nil, shareErr(err)
	}
	return &api.GiveResponse{Amount: amt, Seq: seq, Reason: reason}, nil
}

func (st *shareState) receive(ctx context.Context, in *api.ReceiveRequest) (*api.ReceiveResponse, error) {
	m, err := st.moverOrErr()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	now, err := m.Receive(ctx, in.Tenant, int(in.Giver), int(in.Receiver), in.Seq, in.Amount)
	if err != nil {
		return nil, shareErr(err)
	}
	return &api.ReceiveResponse{AppliedNow: now}, nil
}

func (st *shareState) complete(ctx context.Context, in *api.CompleteRequest) (*api.CompleteResponse, error) {
	m, err := st.moverOrErr()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	found, err := m.Complete(ctx, in.Tenant, int(in.Giver), in.Seq)
	if err != nil {
		return nil, shareErr(err)
	}
	return &api.CompleteResponse{Found: found}, nil
}

func (st *shareState) cover(ctx context.Context, in *api.CoverRequest) (*api.CoverResponse, error) {
	m, err := st.moverOrErr()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if in.MaxSeries < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_series %d: must be ≥ 0", in.MaxSeries)
	}
	covered, over, reason, err := m.Cover(ctx, in.Tenant, int(in.Group), in.MaxSeries)
	if err != nil {
		return nil, shareErr(err)
	}
	return &api.CoverResponse{Covered: covered, Overdraft: over, Reason: reason}, nil
}

// authorize applies the admin rule: a forged Receive could raise a share.
func (sv *sharesService) authorize(ctx context.Context) error {
	if isNodeCall(ctx) || sv.st.s.creds != nil {
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
	switch sv.st.s.adminVerdictFor(remote, md.Get("authorization")) {
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
	return sv.st.give(ctx, in)
}

func (sv *sharesService) Receive(ctx context.Context, in *api.ReceiveRequest) (*api.ReceiveResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.st.receive(ctx, in)
}

func (sv *sharesService) Complete(ctx context.Context, in *api.CompleteRequest) (*api.CompleteResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.st.complete(ctx, in)
}

func (sv *sharesService) Cover(ctx context.Context, in *api.CoverRequest) (*api.CoverResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.st.cover(ctx, in)
}

// run re-drives stranded transfers until the node stops.
func (st *shareState) run(stop <-chan struct{}) {
	if st.mover == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
	st.mover.Run(ctx, 500*time.Millisecond)
}

// TenantShares is one group's view of a tenant's share, for status pages.
type TenantShares struct {
	Group       int               `json:"group"`
	Base        int64             `json:"base"`
	Delta       int64             `json:"delta"`
	Share       int64             `json:"share"`
	Given       int64             `json:"given"`
	Received    int64             `json:"received"`
	Moves       int64             `json:"moves"`
	Outstanding []shares.Transfer `json:"outstanding,omitempty"`
}

// tenantShares reads group g's replica of tenant's shares on this node.
func (st *shareState) tenantShares(g int, tenant string) TenantShares {
	v := st.mods[g].View(tenant)
	base := st.Base(g, tenant)
	share := base + v.Delta
	if st.s.cfg.ShareMode == ShareStatic {
		lo, hi := api.GroupRange(g, st.s.cfg.Partitions, st.s.cfg.Groups)
		base = GroupShare(st.s.groupLimits(g).For(tenant).MaxSeries, hi-lo, st.s.cfg.Partitions)
		share = base + v.Delta // as share() decides (delta is 0 unless a movable node moved headroom)
		if base == 0 {
			share = 0
		}
	}
	return TenantShares{Group: g, Base: base, Delta: v.Delta, Share: share, Given: v.Given, Received: v.Received, Moves: v.Moves, Outstanding: v.Outstanding}
}

// TenantShares serves `tollgate status --tenant T` from this node's replicas.
// Reading needs no leader and no movable mode (static shows the fixed split).
func (sv *sharesService) TenantShares(ctx context.Context, in *api.TenantSharesRequest) (*api.TenantSharesResponse, error) {
	if err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	return sv.st.tenantSharesRPC(in)
}

func (st *shareState) tenantSharesRPC(in *api.TenantSharesRequest) (*api.TenantSharesResponse, error) {
	if err := api.ValidateTenantID(in.Tenant); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s := st.s
	if !s.KnownTenant(in.Tenant) {
		return nil, status.Errorf(codes.NotFound, "tenant %q is unknown on node %s: it never sent series to the groups this node holds and has no entry in the runtime limits", in.Tenant, s.cfg.NodeID)
	}
	u := s.Usage(in.Tenant)
	out := &api.TenantSharesResponse{Tenant: in.Tenant, MaxSeries: u.MaxSeries, ShareMode: s.cfg.ShareMode, NodeId: s.cfg.NodeID}
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
