package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/fsm"
)

// trackerConfig is what the server knows of one group's leader path.
type trackerConfig struct {
	Group             int
	PartitionsInGroup int
	Partitions        int
	IdleMinutes       int        // idle age (fsm.IdleAge of the timeout)
	ExpireAge         func() int // idle age for expire entries; nil: IdleMinutes
	BatchWindow       time.Duration
	MaxBatchHashes    int
	MaxInFlight       int
	ApplyTimeout      time.Duration
	Clock             func() time.Time
	// Share overrides the static split when set (movable shares).
	Share func(tenant string) int64
	// OnReset runs with the FSM's ResetReservations (a new leader session).
	OnReset func()
	// Track, when set, wraps each request's decision (borrow and re-decide).
	Track func(ctx context.Context, g int, t *admission.Tracker, tenant string, hashes []uint64) ([]uint64, error)
	// Fence is admission.Config.Fence (partition hand-offs).
	Fence func(tenant string, hashes []uint64) error
}

// groupTracker wires one group's admission.Tracker to this node: the group's
// FSM as committed state, its raft as the log, the runtime limits as group
// shares, and the node's metrics.
type groupTracker struct {
	t     *admission.Tracker
	group int
	wrap  func(ctx context.Context, g int, t *admission.Tracker, tenant string, hashes []uint64) ([]uint64, error)
}

// resetState adds a hook to the FSM's ResetReservations: reservations other
// than series (outgoing headroom) reset in the same step.
type resetState struct {
	*fsm.FSM
	onReset func()
}

func (r resetState) ResetReservations() {
	r.FSM.ResetReservations()
	r.onReset()
}

func newGroupTracker(cfg trackerConfig, f *fsm.FSM, r *raft.Raft, limits func() *Limits, log *slog.Logger, m *metrics) *groupTracker {
	share := cfg.Share
	if share == nil {
		share = func(tenant string) int64 {
			return GroupShare(limits().For(tenant).MaxSeries, cfg.PartitionsInGroup, cfg.Partitions)
		}
	}
	var st admission.State = f
	if cfg.OnReset != nil {
		st = resetState{f, cfg.OnReset}
	}
	return &groupTracker{group: cfg.Group, wrap: cfg.Track, t: admission.New(admission.Config{
		Group:          cfg.Group,
		IdleMinutes:    cfg.IdleMinutes,
		ExpireAge:      cfg.ExpireAge,
		BatchWindow:    cfg.BatchWindow,
		MaxBatchHashes: cfg.MaxBatchHashes,
		MaxInFlight:    cfg.MaxInFlight,
		ApplyTimeout:   cfg.ApplyTimeout,
		Clock:          cfg.Clock,
		Share:          share,
		Fence:          cfg.Fence,
		Metrics:        groupMetrics{m: m, group: cfg.Group},
		Logger:         log,
	}, st, admission.RaftLog(r))}
}

// setLeader starts or stops the leader session. Called on every leadership change.
func (g *groupTracker) setLeader(leader bool) { g.t.SetLeader(leader) }

// ready reports whether this node leads the group and passed its leader barrier.
func (g *groupTracker) ready() bool { return g.t.Ready() }

// leading reports whether a leader session runs (ready or not).
func (g *groupTracker) leading() bool { return g.t.Leading() }

// testBreak, when set, replaces track with a deliberately broken version of
// it. Only broken_build.go sets it, and that file compiles only with the
// tollgate_broken build tag: the fault tests build such a binary to prove
// that their history checker catches a broken server. No production build
// (make build, the release, the container image) uses the tag, so there
// this is always nil.
var testBreak func(ctx context.Context, g *groupTracker, tenant string, hashes []uint64) ([]uint64, error)

// track submits a request and waits for its decision and commit.
func (g *groupTracker) track(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	if testBreak != nil {
		return testBreak(ctx, g, tenant, hashes)
	}
	return g.trackCommitted(ctx, tenant, hashes)
}

// trackCommitted is the correct track: decided by the leader, answered
// after commit.
func (g *groupTracker) trackCommitted(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	if g.wrap != nil {
		return g.wrap(ctx, g.group, g.t, tenant, hashes)
	}
	return g.t.Track(ctx, tenant, hashes)
}

// groupMetrics binds the node's metrics to one group for the admission package.
type groupMetrics struct {
	m     *metrics
	group int
}

func (gm groupMetrics) SeriesDecided(created, refreshed, rejected int) {
	gm.m.seriesDecided(gm.group, created, refreshed, rejected)
}

func (gm groupMetrics) EntryAppended(bytes, hashes int) { gm.m.entryAppended(gm.group, bytes, hashes) }

func (gm groupMetrics) CommitLatency(d time.Duration) { gm.m.commitLatency(gm.group, d) }
