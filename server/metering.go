package server

import (
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/service/metering"
)

// Continuous-usage metering (package service/metering) wired to this node: every
// group's FSM carries a metering module, events and samplers propose through
// proposeVersioned (cluster version 3), REST endpoints mount on the HTTP mux
// and the Metering service on the gRPC server.

// meteringHost adapts the server to metering.Host: the node's port and
// the metering state of each group.
type meteringHost struct {
	nodePort
	s *Server
}

// GroupOf routes a target hash to the group holding its metering: its
// partition's owner in the layout table once every member runs a build
// that moves metering with its partition (meterByLayout), the arithmetic
// of the created count before. (A partition whose series a build without
// metering moves handed on keeps its metering home: HomeOf, which the
// service tries when the owner answers Moved.)
func (h meteringHost) GroupOf(hash uint64) int {
	p := api.Partition(hash, h.s.cfg.Layout.Partitions)
	if h.s.meterByLayout() {
		return h.s.layout.Owner(p)
	}
	return layout.GroupOf(p, h.s.cfg.Layout.Partitions, h.s.base)
}

// HomeOf is the group the created count's arithmetic gives a target hash.
func (h meteringHost) HomeOf(hash uint64) int {
	p := h.s.cfg.Layout.Partitions
	return layout.GroupOf(api.Partition(hash, p), p, h.s.base)
}

// meterByLayout reports whether metering routes by the layout table: once
// no member that has not left advertises a build below
// fsmmeter.TargetsClusterVersion. Before, a raised group's replica on an
// older build would take events of partitions whose metering it does not
// hold. Asked at most once a second; once true it stays (a downgrade is not
// supported).
func (s *Server) meterByLayout() bool {
	if s.meterRoute.on.Load() {
		return true
	}
	now := time.Now().UnixNano()
	last := s.meterRoute.checked.Load()
	if now-last < int64(time.Second) || !s.meterRoute.checked.CompareAndSwap(last, now) {
		return false
	}
	if len(s.membersBelow(fsmmeter.TargetsClusterVersion)) == 0 {
		s.meterRoute.on.Store(true)
		return true
	}
	return false
}

func (h meteringHost) Module(g int) *fsmmeter.Module { return h.s.meterMods[g] }

func (h meteringHost) TenantsActive(g int) []fsmmeter.TenantActive {
	ts := h.s.fsms[g].Tenants()
	out := make([]fsmmeter.TenantActive, 0, len(ts))
	for _, t := range ts {
		out = append(out, fsmmeter.TenantActive{Tenant: t.Name, Active: t.Active()})
	}
	return out
}

// meteringModules creates one metering module per group (before the FSMs),
// each observing its group's time.
func (s *Server) meteringModules() {
	s.meterMods = make([]*fsmmeter.Module, s.groupCap())
	for g := range s.cfg.Layout.Groups {
		s.meteringModule(g)
	}
}

// meteringModule creates group g's module (at start, or when a raise adds
// the group, groups.go).
func (s *Server) meteringModule(g int) {
	m := fsmmeter.New(g)
	lo, hi := layout.GroupSpan(g, s.cfg.Layout.Partitions, s.base)
	m.SetHome(s.cfg.Layout.Partitions, lo, hi)
	m.SetTimeObserver(s.clock.Group(g).Observe)
	s.meterMods[g] = m
}

// startMetering starts the metering service once raft runs.
func (s *Server) startMetering() error {
	mc := s.cfg.Metering
	mc.Logger = s.log
	mc.Registerer = s.metrics.reg
	clk := metering.NewClock(s.cfg.Clock.Now, mc.TestClock)
	// Each group's entries carry its group time (clockbound), so the slack
	// check, dedup expiry and sampler boundaries read one clock.
	clk.SetGroupTime(func(g int) int64 { return s.clock.Group(g).Now() })
	svc, err := metering.New(mc, meteringHost{nodePort{s}, s}, clk)
	if err != nil {
		return err
	}
	s.meter = svc
	return nil
}

func (s *Server) registerMetering(gs *grpc.Server) {
	if s.meter != nil {
		s.meter.RegisterGRPC(gs)
	}
}

func (s *Server) mountMetering(mux metering.Router) {
	if s.meter != nil {
		s.meter.Mount(mux, s.requireAdmin)
	}
}

func (s *Server) stopMetering() {
	if s.meter != nil {
		s.meter.Stop()
	}
}

// Metering is the node's metering service (tests, status).
func (s *Server) Metering() *metering.Service { return s.meter }
