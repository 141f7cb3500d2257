package server

import (
	"errors"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/partmove"
	pmsvc "github.com/tollgate-io/tollgate/service/partmove"
)

// Partition hand-offs (docs/online-groups.md): every group's FSM carries an
// fsm/partmove module; service/partmove answers PartitionMoves, fences each
// group's leader path and, on group 0's leader, moves partitions to the
// raised layout's target.

// partMoveEvery is the coordinator's pause between passes.
const partMoveEvery = time.Second

func (s *Server) partMovesComponent() component {
	return component{name: "partition moves", build: s.setupPartMoves,
		modules:  func(g int) []fsm.Module { return []fsm.Module{s.pmods[g]} },
		addGroup: func(g int) error { s.pmods[g] = partmove.New(g, s.cfg.Layout.Partitions, s.base); return nil },
		grpc:     func(g *grpc.Server) error { api.RegisterPartitionMovesServer(g, s.moves); return nil },
		start:    func() { s.goUntilStop(func(stop <-chan struct{}) { s.moves.Run(stop, partMoveEvery) }) }}
}

func (s *Server) setupPartMoves() error {
	s.pmods = make([]*partmove.Module, s.groupCap())
	for g := range s.cfg.Layout.Groups {
		s.pmods[g] = partmove.New(g, s.cfg.Layout.Partitions, s.base)
	}
	s.moves = pmsvc.New(pmsvc.Config{
		Port:       nodePort{s},
		Partitions: s.cfg.Layout.Partitions,
		Base:       s.base,
		Module: func(g int) *partmove.Module {
			if !s.servesGroup(g) { // being added (groups.go)
				return nil
			}
			return s.pmods[g]
		},
		AppendFenced: func(g int, fn func() error, data []byte) (any, error) {
			if !s.servesGroup(g) {
				return nil, admission.ErrNotLeader
			}
			return s.trackers[g].t.AppendFenced(fn, data)
		},
		CheckEntry:    s.checkEntryType,
		MeterMoves:    func() bool { return !s.meterRoute.seriesOnly.Load() && s.meterByLayout() },
		Minute:        func(g int) int64 { return nodePort{s}.entryMinute(g) },
		Layout:        s.layout.Module().Current,
		ProposeLayout: s.layout.Propose,
		MovedErr:      s.layout.MovedErr,
		Log:           s.log,
		Metrics:       pmsvc.NewMetrics(s.metrics.reg),
	})
	return nil
}

// bindPartMoves gives each group's module its FSM and shares (after the FSMs
// exist).
func (s *Server) bindPartMoves() {
	for g := range s.cfg.Layout.Groups {
		s.pmods[g].Bind(s.fsms[g], s.shares.Module(g), s.meterMods[g])
	}
}

// groupMayCampaign keeps this node from leading a group it is still
// adding (groups.go): until its leader path (tracker, shares, fence) exists,
// a leader would answer for partitions handed to the group with nobody
// deciding. (A replica its leader removed without it knowing,
// cluster/stale.go, is not gated here: that mark comes from asking a
// gossiped leader, and a wrong one must never keep the group from electing;
// its pre-votes only make the peers log a refusal.)
func (s *Server) groupMayCampaign(g int) error {
	if g >= s.bootGroups && !s.servesGroup(g) {
		return errNotServed
	}
	return nil
}

var errNotServed = errors.New("this node is still creating the group's state: it campaigns once the group is served")
