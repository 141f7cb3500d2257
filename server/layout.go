package server

import (
	"context"

	fsmlayout "github.com/tollgate-io/tollgate/fsm/layouttable"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/service/layouttable"
)

// The partition → group table: group 0's FSM carries it (fsm/layouttable),
// service/layouttable decides by it; tracking, near-limit reads and metering
// route partitions through ownerOf.

func (s *Server) setupLayout() error {
	mod := fsmlayout.New(s.cfg.Layout.Partitions, s.base, s.layoutChanged) // groups.go
	mod.SetOnRaise(s.raiseApplied)
	s.layout = layouttable.New(mod, nodePort{s}, s.cfg.Layout.Partitions, s.leaderOf)
	return nil
}

// ownerOf is the group owning partition p by this node's table.
func (s *Server) ownerOf(p int) int { return s.layout.Owner(p) }

// ProposeLayout replaces the layout table through group 0's log
// (layouttable.Service.Propose); this node must lead group 0. No admin
// command calls it yet (the coordinator of docs/online-groups.md will);
// tests do.
func (s *Server) ProposeLayout(ctx context.Context, t *layout.Table) (uint64, error) {
	return s.layout.Propose(ctx, t)
}
