package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/meterserver"
)

// Continuous-usage metering (package meterserver) wired to this node: every
// group's FSM carries a metering module, events and samplers propose through
// proposeVersioned (cluster version 3), REST endpoints mount on the HTTP mux
// and the Metering service on the gRPC server.

// meteringHost adapts the server to meterserver.Host.
type meteringHost struct{ s *Server }

func (h meteringHost) Groups() int { return h.s.cfg.Groups }

func (h meteringHost) GroupOf(hash uint64) int {
	p := h.s.cfg.Partitions
	return api.GroupOf(api.Partition(hash, p), p, h.s.cfg.Groups)
}

// IsLeader is Server.leads: the sampler plans from current state.
func (h meteringHost) IsLeader(g int) bool { return h.s.leads(g) }

func (h meteringHost) Hosts(g int) bool { return h.s.hostsGroup(g) }

func (h meteringHost) LeaderGRPC(g int) (string, string) { return h.s.leaderOf(g) }

func (h meteringHost) NodeID() string { return h.s.cfg.NodeID }

func (h meteringHost) PeerConn(addr string) (*grpc.ClientConn, error) {
	if h.s.admin == nil {
		return nil, status.Error(codes.Unavailable, "node starting: no peer connections yet")
	}
	return h.s.admin.conn(addr)
}

func (h meteringHost) Module(g int) *fsmmeter.Module { return h.s.meterMods[g] }

func (h meteringHost) Propose(ctx context.Context, g int, typ byte, payload []byte) (any, error) {
	data, err := fsm.AppendModuleEntry(nil, typ, h.s.clock.groupMinute(g), payload)
	if err != nil {
		return nil, fmt.Errorf("group %d: encode metering entry: %w", g, err)
	}
	resp, _, err := h.s.proposeVersioned(ctx, g, typ, data)
	return resp, err
}

func (h meteringHost) TenantsActive(g int) []fsmmeter.TenantActive {
	ts := h.s.fsms[g].Tenants()
	out := make([]fsmmeter.TenantActive, 0, len(ts))
	for _, t := range ts {
		out = append(out, fsmmeter.TenantActive{Tenant: t.Name, Active: t.Active()})
	}
	return out
}

// meteringModules creates one metering module per group (before the FSMs).
func (s *Server) meteringModules() {
	s.meterMods = make([]*fsmmeter.Module, s.cfg.Groups)
	for g := range s.meterMods {
		s.meterMods[g] = fsmmeter.New(g)
	}
}

// startMetering starts the metering service once raft runs.
func (s *Server) startMetering() error {
	mc := s.cfg.Metering
	mc.Logger = s.log
	mc.Registerer = s.metrics.reg
	clk := meterserver.NewClock(s.cfg.Clock, mc.TestClock)
	// Each group's entries carry its group time (clock.go), so the slack
	// check, dedup expiry and sampler boundaries read one clock.
	clk.SetGroupTime(func(g int) int64 { return s.clock.groups[g].Now() })
	svc, err := meterserver.New(mc, meteringHost{s}, clk)
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

func (s *Server) mountMetering(mux meterserver.Router) {
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
func (s *Server) Metering() *meterserver.Service { return s.meter }
