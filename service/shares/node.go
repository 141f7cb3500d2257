package shares

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/nodeport"
)

// Share modes (server.Config.Shares.Mode).
const (
	// ModeMovable (the default): each group's share of a tenant's
	// max_series starts at an exact split and headroom moves between groups
	// on demand (service/shares), so max_series holds per tenant.
	ModeMovable = "movable"
	// ModeStatic: the fixed split ceil(max_series × partitions_in_group / P)
	// of earlier builds; nothing moves. Kept selectable (--share-mode static)
	// for clusters that ran it and as the benchmark baseline. Headroom that
	// movable leaders moved before (a switch of modes) is honoured: share =
	// fixed + delta.
	ModeStatic = "static"
)

// Gate says whether a group may take share-move entries (NodeConfig.VersionGate).
type Gate uint8

// The gates: every server of the group supports the entries; a server is
// older (a rolling upgrade); a server's version is not known yet.
const (
	GateOpen Gate = iota
	GateClosed
	GateUnknown
)

// NodeConfig is what movable shares need of the node beyond its port.
type NodeConfig struct {
	Port       nodeport.Port
	Partitions int
	// Groups is the group count the node starts with; AddGroup adds the
	// groups a raise creates while it runs.
	Groups int
	// Base is the group count the layout was created with (0: Groups):
	// groups from Base up were added by a raise and own no partition, so
	// their base share is 0 (layout.GroupSpan).
	Base int
	Mode string // ModeMovable or ModeStatic
	// Limit is tenant's max_series in group g's replica of the limits (0:
	// unlimited) and the runtime config version that set it.
	Limit func(g int, tenant string) (limit int64, version uint64)
	// Fixed is group g's static share of tenant's max_series (0: unlimited).
	Fixed func(g int, tenant string) int64
	// Usage is tenant's active series and reservations in group g here.
	Usage func(g int, tenant string) (active, reserved int64)
	// Exclusive runs fn on group g's leader with its decider paused
	// (admission.Tracker.Exclusive).
	Exclusive func(g int, fn func() error) error
	// VersionGate says whether every server of group g applies entries of
	// a cluster version.
	VersionGate func(g, version int) Gate
	// TenantShares serves the TenantShares call for this node's own client.
	TenantShares func(*api.TenantSharesRequest) (*api.TenantSharesResponse, error)
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

// Node is movable shares on one node: each group's module (fsm/shares),
// the share functions admission decides with, the mover and the calls it
// serves.
type Node struct {
	nodeport.Port // Host's node half: leadership, proposals, the leader's connection
	cfg           NodeConfig
	base          int // the created group count (cfg.Base or cfg.Groups): AddGroup leaves it
	// groups is copy-on-write: admission reads it on every decision and
	// must not wait for AddGroup, which publishes a longer copy.
	groups  atomic.Pointer[[]*nodeGroup]
	addMu   sync.Mutex // one AddGroup at a time, so two cannot both add the same next group
	mover   *Mover
	metrics *shareMetrics
	born    time.Time // when this node started (moveGate's grace)
}

// nodeGroup is one group's state here. The slice holds pointers so that
// AddGroup's copy never moves a group: its module is in the group's FSM
// already, and a gate check stored into an old copy would be lost.
type nodeGroup struct {
	mod     *shares.Module
	movesOK movesCheck
}

// ErrGroupExists is returned by AddGroup for a group this node already has:
// a caller retrying a group creation that failed further on takes it as
// done.
var ErrGroupExists = errors.New("shares: group already exists")

// ErrGroupOutOfRange is returned by AddGroup for a group beyond the next one.
var ErrGroupOutOfRange = errors.New("shares: group out of range")

// versionsGrace bounds how long after its start a node treats a server
// missing from its member list as "not heard of yet" (moveGate's
// GateUnknown): gossip converges within seconds of a restart, and a server
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

// moveGate says whether group g can take share-move entries: GateOpen when
// every server of the group supports their cluster version. During a rolling
// upgrade from a build without movable shares (GateClosed) the group decides
// by the static rule (its share, no borrow, no cover) as that build did,
// instead of refusing new series until the upgrade ends. GateUnknown: a
// server's version is not known yet (this leader restarted and has not
// heard its peers' gossip): the group decides by the static rule too, but a
// series refused at its share is a retryable error, not a rejection (the
// other groups may well have headroom for it), unless the group has applied
// a share-move entry already (its servers could all apply one then, and
// still can: downgrades are unsupported), and only for versionsGrace after
// the node's start. Checked at most once a second per
// group (the check reads the raft configuration).
func (st *Node) moveGate(g int) Gate {
	ng := st.group(g)
	if ng == nil {
		// Not added here yet (a caller's count ran ahead): as unknown,
		// a refusal at the share stays retryable.
		return GateUnknown
	}
	c := &ng.movesOK
	now := time.Now().UnixNano()
	if at := c.at.Load(); at != 0 && now-at < int64(time.Second) {
		return Gate(c.gate.Load())
	}
	info, _ := fsm.LookupEntryType(shareMoveEntry)
	gt := st.cfg.VersionGate(g, info.Since)
	switch {
	case gt != GateUnknown:
	case ng.mod.MovesApplied():
		gt = GateOpen
	case time.Since(st.born) > versionsGrace:
		gt = GateClosed
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

// ModuleGroups is the group count group g's shares module is created with:
// the groups that existed when g was created, so that every replica of g,
// restarted after a raise or not, refuses the same gives (to a group the
// module does not know) and reads the same snapshots. Groups a raise added
// (g ≥ base) are created one at a time, each the last. Headroom moves into
// raised groups come with the partition hand-off (docs/online-groups.md).
func ModuleGroups(g, base int) int { return max(base, g+1) }

// NewNode returns the node's shares state (its modules go into the FSMs)
// and registers its metrics.
func NewNode(cfg NodeConfig) (*Node, error) {
	st := &Node{Port: cfg.Port, cfg: cfg, base: cmp.Or(cfg.Base, cfg.Groups), born: time.Now()}
	gs := make([]*nodeGroup, cfg.Groups)
	for g := range gs {
		ng, err := st.newGroup(g)
		if err != nil {
			return nil, err
		}
		gs[g] = ng
	}
	st.groups.Store(&gs)
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
	cfg.Registerer.MustRegister(st.metrics.moves, st.metrics.moved, st.metrics.recovered, st.metrics.rejections, st.metrics.borrow)
	st.metrics.rejections.WithLabelValues("share") // at zero from the start (see initGroups)
	st.metrics.rejections.WithLabelValues("limit")
	if cfg.Mode == ModeMovable {
		st.mover = New(st, cfg.Logger, st.metrics)
	}
	return st, nil
}

// newGroup builds group g's state, at start and in AddGroup alike, so a
// group added while the node runs has the module a restart would give it.
func (st *Node) newGroup(g int) (*nodeGroup, error) {
	m, err := shares.New(g, ModuleGroups(g, st.base))
	if err != nil {
		return nil, err
	}
	return &nodeGroup{mod: m}, nil
}

// AddGroup creates group g's shares module (g must be the next group) while
// the node runs, as NewNode creates one, so that the group's state machine
// can be built with FSMModules(g). Only then may the node port count g
// (Groups): the mover reads the modules of every group below that count.
// An existing group is refused with ErrGroupExists, any other with
// ErrGroupOutOfRange.
func (st *Node) AddGroup(g int) error {
	st.addMu.Lock()
	defer st.addMu.Unlock()
	gs := *st.groups.Load()
	n := len(gs)
	switch {
	case g >= 0 && g < n:
		return fmt.Errorf("%w: add group %d: this node has groups 0..%d", ErrGroupExists, g, n-1)
	case g != n:
		return fmt.Errorf("%w: add group %d: groups are added in order and the next one here is %d", ErrGroupOutOfRange, g, n)
	}
	ng, err := st.newGroup(g)
	if err != nil {
		return err
	}
	// A full slice expression, so append copies instead of writing into
	// spare capacity that a reader of the old slice could share.
	next := append(gs[:n:n], ng)
	st.groups.Store(&next)
	return nil
}

// group is group g's state here; nil for a group not added (yet), which a
// caller holding a newer count (a layout table, another node's) can name.
func (st *Node) group(g int) *nodeGroup {
	gs := *st.groups.Load()
	if g < 0 || g >= len(gs) {
		return nil
	}
	return gs[g]
}

// delta is the module's Delta; a group not added here yet has applied
// nothing, so it reads as a new module would: 0.
func (st *Node) delta(g int, tenant string) (delta, reservedOut int64) {
	if ng := st.group(g); ng != nil {
		return ng.mod.Delta(tenant)
	}
	return 0, 0
}

// FSMModules is group g's FSM module (nil before AddGroup(g)).
func (st *Node) FSMModules(g int) []fsm.Module {
	ng := st.group(g)
	if ng == nil {
		return nil
	}
	return []fsm.Module{ng.mod}
}

// Share returns group g's share function (near-limit lists, status pages).
func (st *Node) Share(g int) func(tenant string) int64 {
	if st.cfg.Mode == ModeStatic {
		return func(tenant string) int64 {
			fixed := st.cfg.Fixed(g, tenant)
			if fixed == 0 {
				return 0 // unlimited
			}
			// Headroom moved while a movable node led this group stays
			// moved: a cluster switching modes node by node has static and
			// movable leaders at once, and a static leader that ignored what
			// its group gave away would let the receiver and itself both
			// use it. With it, Σ shares ≤ Σ fixed + Σ delta ≤ Σ fixed. A
			// cluster that never ran movable has delta 0 everywhere.
			delta, _ := st.delta(g, tenant)
			if v := fixed + delta; v > 0 {
				return v
			}
			return admission.NoHeadroom
		}
	}
	return func(tenant string) int64 {
		delta, res := st.delta(g, tenant)
		limit, _ := st.cfg.Limit(g, tenant)
		return Share(limit, st.Base(g, tenant), delta, res)
	}
}

// AdmitShare is group g's share function for admission: Share, except that
// in movable mode a tenant this leader session has not settled since its
// limit last changed gets no headroom for new series (Mover.Admit settles it
// before deciding; refreshes never depend on it). Near-limit lists and
// status pages use Share.
func (st *Node) AdmitShare(g int) func(tenant string) int64 {
	share := st.Share(g)
	if st.mover == nil {
		return share
	}
	return func(tenant string) int64 {
		if !st.mover.Settled(g, tenant) && st.moveGate(g) != GateClosed {
			return admission.NoHeadroom
		}
		return share(tenant)
	}
}

// Track decides a request in group g. In movable mode, series refused only
// for the group's share make the mover borrow headroom from the other groups
// and decide them again: a rejection then means every group answered that it
// has none (at="limit"), and a borrow that cannot establish that (a group
// has no leader) is an Unavailable error, never a rejection below the limit.
// In static mode nothing moves and a share rejection is counted at="share";
// so it is while a rolling upgrade keeps share moves off (moveGate).
func (st *Node) Track(ctx context.Context, g int, t *admission.Tracker, tenant string, hashes []uint64) ([]uint64, error) {
	gt := GateOpen
	if st.mover != nil {
		gt = st.moveGate(g)
	}
	if st.mover == nil || gt != GateOpen {
		rejected, atShare, err := t.TrackAtShare(ctx, tenant, hashes)
		if err == nil && atShare > 0 {
			if gt == GateUnknown {
				// The accepted ones are committed; a retry refreshes them.
				return nil, fmt.Errorf("%d series of tenant %s refused at the group's share while this leader does not know its peers' versions yet (it just started; share moves wait for them): %w",
					atShare, tenant, ErrHeadroomUnreachable)
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

// --- Host ---

// Module is group g's shares module on this node (nil before AddGroup(g)).
func (st *Node) Module(g int) *shares.Module {
	if ng := st.group(g); ng != nil {
		return ng.mod
	}
	return nil
}

// Usage is tenant's active series and reservations in group g here.
func (st *Node) Usage(g int, t string) (int64, int64) { return st.cfg.Usage(g, t) }

// Base is group g's exact base share of tenant's max_series.
func (st *Node) Base(g int, tenant string) int64 {
	lo, hi := layout.GroupSpan(g, st.cfg.Partitions, st.base)
	limit, _ := st.cfg.Limit(g, tenant)
	return shares.Split(limit, lo, hi, st.cfg.Partitions)
}

// Limit is tenant's max_series in group g's replica and its config version.
func (st *Node) Limit(g int, tenant string) (int64, uint64) { return st.cfg.Limit(g, tenant) }

// Exclusive runs fn with group g's decider paused.
func (st *Node) Exclusive(g int, fn func() error) error {
	err := st.cfg.Exclusive(g, fn)
	if errors.Is(err, admission.ErrNotLeader) {
		return ErrNotLeader
	}
	return err
}

// Peer is a client for group g's shares service: this node's own when it
// leads g, else the leader's (nodeport: the mover calls for the node, so the
// pool's calls carry the node's token).
func (st *Node) Peer(ctx context.Context, g int) (api.SharesClient, error) {
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
type localShares struct{ st *Node }

func (l localShares) Give(ctx context.Context, in *api.GiveRequest, _ ...grpc.CallOption) (*api.GiveResponse, error) {
	return l.st.Give(ctx, in)
}
func (l localShares) Receive(ctx context.Context, in *api.ReceiveRequest, _ ...grpc.CallOption) (*api.ReceiveResponse, error) {
	return l.st.Receive(ctx, in)
}
func (l localShares) TenantShares(_ context.Context, in *api.TenantSharesRequest, _ ...grpc.CallOption) (*api.TenantSharesResponse, error) {
	return l.st.cfg.TenantShares(in)
}
func (l localShares) Complete(ctx context.Context, in *api.CompleteRequest, _ ...grpc.CallOption) (*api.CompleteResponse, error) {
	return l.st.Complete(ctx, in)
}
func (l localShares) Cover(ctx context.Context, in *api.CoverRequest, _ ...grpc.CallOption) (*api.CoverResponse, error) {
	return l.st.Cover(ctx, in)
}

// --- Metrics ---

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
	st *Node
}

func (st *Node) moverOrErr() (*Mover, error) {
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
	if errors.Is(err, ErrNotLeader) {
		return status.Errorf(codes.Unavailable, "shares: %v; retry at the group's leader", err)
	}
	return status.Errorf(codes.InvalidArgument, "shares: %v", err)
}

// Give serves one Shares.Give call.
func (st *Node) Give(ctx context.Context, in *api.GiveRequest) (*api.GiveResponse, error) {
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

// Receive serves one Shares.Receive call.
func (st *Node) Receive(ctx context.Context, in *api.ReceiveRequest) (*api.ReceiveResponse, error) {
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

// Complete serves one Shares.Complete call.
func (st *Node) Complete(ctx context.Context, in *api.CompleteRequest) (*api.CompleteResponse, error) {
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

// Cover serves one Shares.Cover call.
func (st *Node) Cover(ctx context.Context, in *api.CoverRequest) (*api.CoverResponse, error) {
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

// Run re-drives stranded transfers until stop is closed.
func (st *Node) Run(stop <-chan struct{}) {
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

// TenantShares reads group g's replica of tenant's shares on this node.
func (st *Node) TenantShares(g int, tenant string) TenantShares {
	var v shares.TenantView // a group not added here yet: nothing applied
	if ng := st.group(g); ng != nil {
		v = ng.mod.View(tenant)
	}
	base := st.Base(g, tenant)
	share := base + v.Delta
	if st.cfg.Mode == ModeStatic {
		base = st.cfg.Fixed(g, tenant)
		share = base + v.Delta // as Share decides (delta is 0 unless a movable node moved headroom)
		if base == 0 {
			share = 0
		}
	}
	return TenantShares{Group: g, Base: base, Delta: v.Delta, Share: share, Given: v.Given, Received: v.Received, Moves: v.Moves, Outstanding: v.Outstanding}
}
