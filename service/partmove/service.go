package partmove

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	fsmpm "github.com/tollgate-io/tollgate/fsm/partmove"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/nodeport"
)

// Config is what the service needs of its node.
type Config struct {
	Port       nodeport.Port
	Partitions int
	// Base is the group count the cluster was created with (the layout's
	// arithmetic; layout.RaiseTarget starts from it).
	Base int
	// Module is group g's hand-off module on this node (nil: the node has
	// no state for g yet).
	Module func(g int) *fsmpm.Module
	// AppendFenced appends an entry to group g's log in order with its
	// leader's decisions and returns its response once applied, no decision
	// reading the group's usage or shares meanwhile
	// (admission.Tracker.AppendFenced).
	AppendFenced func(g int, fn func() error, data []byte) (any, error)
	// CheckEntry refuses an entry type some server of group g cannot apply
	// (the cluster-version gate), as a gRPC status.
	CheckEntry func(g int, typ byte) error
	// MeterMoves reports whether gives may take a partition's metering
	// along: every member runs a build that routes metering by the layout
	// table and applies the metering transfer (nil: never).
	MeterMoves func() bool
	// Minute is the minute to stamp on group g's entries.
	Minute func(g int) int64
	// Layout is the table in force by this node's replica of group 0;
	// ProposeLayout replaces it (this node must lead group 0).
	Layout        func() *layout.Table
	ProposeLayout func(ctx context.Context, t *layout.Table) (uint64, error)
	// MovedErr is the Moved answer for partition p asked of group g.
	MovedErr func(p, g int) error
	Log      *slog.Logger
	Metrics  Metrics
}

// Metrics receives the coordinator's progress.
type Metrics interface {
	Pending(n int)                          // partitions not at their target owner
	Moved(series int64, took time.Duration) // one move finished
	Step(kind string)                       // one hand-off step done
}

type noMetrics struct{}

func (noMetrics) Pending(int)                {}
func (noMetrics) Moved(int64, time.Duration) {}
func (noMetrics) Step(string)                {}

// Service is one node's part in partition hand-offs.
type Service struct {
	api.UnimplementedPartitionMovesServer
	cfg Config

	mu      sync.Mutex
	leaving map[int]map[int]bool // group → partitions whose give this node appended and that still apply

	fences []*fence

	progress atomic.Pointer[Progress]

	// stepPause is slept between a move's steps: 0 except in fault tests,
	// which set TOLLGATE_TEST_MOVE_STEP_PAUSE (a duration) so that the kills
	// they aim at a move land between its steps.
	stepPause time.Duration
}

// fence is one group's view for its leader path.
type fence struct {
	leaving atomic.Pointer[[]bool] // by partition; nil: none
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	s := &Service{cfg: cfg, leaving: map[int]map[int]bool{}}
	if v := os.Getenv("TOLLGATE_TEST_MOVE_STEP_PAUSE"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			s.stepPause = d
			cfg.Log.Warn("partition moves slowed for a test", "TOLLGATE_TEST_MOVE_STEP_PAUSE", d)
		}
	}
	s.progress.Store(&Progress{})
	return s
}

func (s *Service) fenceOf(g int) *fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.fences) <= g {
		s.fences = append(s.fences, &fence{})
	}
	return s.fences[g]
}

// Fence is group g's admission.Config.Fence: a request with a series in a
// partition whose give this node appended, or that the group does not own
// once it gave or received one (replicated state), gets the Moved answer and
// is not decided. A group that never took part in a hand-off costs two
// atomic loads per request.
func (s *Service) Fence(g int) func(tenant string, hashes []uint64) error {
	f := s.fenceOf(g)
	return func(_ string, hashes []uint64) error {
		l := f.leaving.Load()
		mod := s.cfg.Module(g)
		owned := mod != nil && mod.Moved()
		if l == nil && !owned {
			return nil
		}
		for _, h := range hashes {
			p := layout.Partition(h, s.cfg.Partitions)
			if (l != nil && (*l)[p]) || (owned && !mod.Owns(p)) {
				return s.cfg.MovedErr(p, g)
			}
		}
		return nil
	}
}

func (s *Service) setLeaving(g, p int, on bool) {
	f := s.fenceOf(g)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.leaving[g]
	if set == nil {
		set = map[int]bool{}
		s.leaving[g] = set
	}
	if on {
		set[p] = true
	} else {
		delete(set, p)
	}
	if len(set) == 0 {
		f.leaving.Store(nil)
		return
	}
	l := make([]bool, s.cfg.Partitions)
	for q := range set {
		l[q] = true
	}
	f.leaving.Store(&l)
}

// module returns group g's module when this node leads g with its state.
func (s *Service) module(g uint32) (*fsmpm.Module, error) {
	if g >= 1<<16 {
		return nil, status.Errorf(codes.InvalidArgument, "group = %d: out of range", g)
	}
	mod := s.cfg.Module(int(g))
	if mod == nil || int(g) >= s.cfg.Port.Groups() {
		return nil, status.Errorf(codes.FailedPrecondition, "group %d: node %s does not serve it yet (a raise added it and the node is still creating its state)", g, s.cfg.Port.NodeID())
	}
	if !s.cfg.Port.Leads(int(g)) {
		return nil, status.Errorf(codes.Unavailable, "group %d: node %s does not lead it; retry at its leader", g, s.cfg.Port.NodeID())
	}
	return mod, nil
}

func (s *Service) checkPartition(p uint32) error {
	if int(p) >= s.cfg.Partitions {
		return status.Errorf(codes.InvalidArgument, "partition = %d: the cluster has %d partitions", p, s.cfg.Partitions)
	}
	return nil
}

// Give implements api.PartitionMovesServer.
func (s *Service) Give(ctx context.Context, in *api.MoveGiveRequest) (*api.MoveGiveResponse, error) {
	if err := s.checkPartition(in.GetPartition()); err != nil {
		return nil, err
	}
	if in.GetTo() == in.GetGroup() {
		return nil, status.Errorf(codes.InvalidArgument, "to = %d: the giver itself", in.GetTo())
	}
	if _, err := s.module(in.GetGroup()); err != nil {
		return nil, err
	}
	g, p := int(in.GetGroup()), int(in.GetPartition())
	// The partition's metering goes with its series once every replica can
	// take it (cluster version 8); before, it stays in its first group, and
	// a later move leaves it there too (fsm/metering, move.go).
	typ := fsmpm.EntryGiveMetering
	if s.cfg.MeterMoves == nil || !s.cfg.MeterMoves() || s.cfg.CheckEntry(g, typ) != nil {
		typ = fsmpm.EntryGive
	}
	if err := s.cfg.CheckEntry(g, typ); err != nil {
		return nil, err
	}
	data, err := fsm.AppendModuleEntry(nil, typ, s.cfg.Minute(g),
		fsmpm.AppendGive(nil, fsmpm.Give{Nonce: in.GetNonce(), Partition: p, To: int(in.GetTo())}))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode partition-give: %v", err)
	}
	// The leaving mark goes up with the append, under the leader path's
	// append lock: every request decided before is in the log before the
	// give (its series are in the transfer), every one after is Moved. Once
	// the give applied (or failed with the leadership), the replicated
	// ownership answers for the partition.
	res, err := s.cfg.AppendFenced(g, func() error { s.setLeaving(g, p, true); return nil }, data)
	s.setLeaving(g, p, false)
	if err != nil {
		if errors.Is(err, admission.ErrNotLeader) || errors.Is(err, admission.ErrStepDown) {
			return nil, status.Errorf(codes.Unavailable, "group %d: node %s does not lead it (%v); retry at its leader", g, s.cfg.Port.NodeID(), err)
		}
		return nil, status.Errorf(codes.Unavailable, "group %d: partition-give: %v", g, err)
	}
	switch r := res.(type) {
	case fsmpm.GiveResult:
		return &api.MoveGiveResponse{Series: r.Series, Already: r.Already, Refused: r.Refused}, nil
	case error:
		return nil, status.Errorf(codes.Internal, "group %d: partition-give: %v", g, r)
	default:
		return nil, status.Errorf(codes.Internal, "group %d: partition-give answered %T", g, r)
	}
}

// Receive implements api.PartitionMovesServer.
func (s *Service) Receive(ctx context.Context, in *api.MoveReceiveRequest) (*api.MoveReceiveResponse, error) {
	t, err := fsmpm.DecodeTransfer(in.GetTransfer(), s.cfg.Partitions)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "transfer: %v", err)
	}
	if t.To != int(in.GetGroup()) {
		return nil, status.Errorf(codes.InvalidArgument, "group = %d: the transfer is for group %d", in.GetGroup(), t.To)
	}
	if _, err := s.module(in.GetGroup()); err != nil {
		return nil, err
	}
	if err := s.cfg.CheckEntry(t.To, fsmpm.EntryReceive); err != nil {
		return nil, err
	}
	data, err := fsm.AppendModuleEntry(nil, fsmpm.EntryReceive, s.cfg.Minute(t.To), in.GetTransfer())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode partition-receive: %v", err)
	}
	// Applied with the receiver's decisions paused, as the give: usage and
	// share rise together for every decision.
	res, err := s.cfg.AppendFenced(t.To, nil, data)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "group %d: partition-receive: %v; retry at its leader", t.To, err)
	}
	r, ok := res.(fsmpm.ReceiveResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "partition-receive answered %T", res)
	}
	return &api.MoveReceiveResponse{Applied: r.Applied, Series: r.Series, Refused: r.Refused}, nil
}

// Complete implements api.PartitionMovesServer.
func (s *Service) Complete(ctx context.Context, in *api.MoveCompleteRequest) (*api.MoveCompleteResponse, error) {
	if _, err := s.module(in.GetGroup()); err != nil {
		return nil, err
	}
	res, err := s.cfg.Port.Propose(ctx, int(in.GetGroup()), fsmpm.EntryComplete, fsmpm.AppendComplete(nil, in.GetNonce()))
	if err != nil {
		return nil, err
	}
	r, ok := res.(fsmpm.CompleteResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "partition-complete answered %T", res)
	}
	return &api.MoveCompleteResponse{Found: r.Found}, nil
}

// State implements api.PartitionMovesServer. It reads the leader's applied
// state, which holds every committed entry of earlier terms (its session
// passed its barrier).
func (s *Service) State(_ context.Context, in *api.MoveStateRequest) (*api.MoveStateResponse, error) {
	mod, err := s.module(in.GetGroup())
	if err != nil {
		return nil, err
	}
	out := &api.MoveStateResponse{Outbox: mod.Outbox(in.GetNonce()), Received: mod.Received(in.GetNonce())}
	if in.GetGroup() == 0 && s.cfg.Layout != nil {
		out.Layout = api.LayoutToProto(s.cfg.Layout()) // for nodes outside group 0 (layouttable.Follow)
	}
	for p := range s.cfg.Partitions {
		if mod.Owns(p) {
			out.Owned = append(out.Owned, uint32(p))
		}
	}
	return out, nil
}

// client returns group g's leader's PartitionMoves (this node's own when it
// leads g).
func (s *Service) client(ctx context.Context, g int) (api.PartitionMovesClient, context.Context, error) {
	if g < s.cfg.Port.Groups() && s.cfg.Port.Leads(g) {
		return local{s}, ctx, nil
	}
	conn, cctx, err := s.cfg.Port.LeaderConn(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	return api.NewPartitionMovesClient(conn), cctx, nil
}

// Progress is the coordinator's state, for status and metrics.
type Progress struct {
	Target  int    // the group count being moved to (0: no raise seen)
	Pending int    // partitions not at their target owner
	Current string // the move under way ("" when none)
	Err     string // the last step's failure, while it lasts
}

// StatusProto is the coordinator's progress for Admin.Status when coordinates
// (this node leads group 0), else nil.
func (s *Service) StatusProto(coordinates bool) *api.PartitionMovesStatus {
	if !coordinates {
		return nil
	}
	p := s.Progress()
	return &api.PartitionMovesStatus{Groups: uint32(p.Target), Pending: uint32(p.Pending), Current: p.Current, Error: p.Err}
}

// Progress returns the coordinator's last state on this node (group 0's
// leader's is the cluster's).
func (s *Service) Progress() Progress { return *s.progress.Load() }
