package server

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/service/layouttable"
	"github.com/tollgate-io/tollgate/service/sampling"
	sharessvc "github.com/tollgate-io/tollgate/service/shares"
)

// component is one capability as the node builds it. New walks one list
// (components) through the node's start, each stage in list order:
//
//  1. build: the capability's state, its FSM modules among it, from the
//     node's port (nodePort) and config; before the FSMs exist.
//  2. modules: group g's FSM modules (each registers its own entry types,
//     fsm.RegisterModuleEntry, and owns a snapshot section), in list order.
//  3. open: what needs the raft groups and leader paths, before gRPC.
//  4. grpc: the gRPC services it registers (before Serve); http: the routes
//     it mounts.
//  5. start: what runs once the listeners, membership and the leadership
//     watcher exist.
//  6. stop, when the node stops: after gRPC stopped, before raft shuts
//     down, in reverse list order.
//
// A group a raise adds while the node runs (groups.go) passes through two
// more: addGroup creates group g's per-group state, before its FSM (which
// takes modules(g)); served runs once the group's leader path exists.
//
// So adding a capability is a state package, a service package and one
// entry here. Every stage is optional.
type component struct {
	name    string
	build   func() error
	modules func(g int) []fsm.Module
	open    func() error
	grpc    func(*grpc.Server) error
	http    func(*routeMux)
	start   func()
	stop    func()

	addGroup func(g int) error
	served   func(g int)
}

// components is the node's capabilities, in the order they are built,
// registered and started. The order of the FSM modules (shares, runtime
// config, metering) is the order of their snapshot sections.
func (s *Server) components() []component {
	register := func(fn func(*grpc.Server)) func(*grpc.Server) error {
		return func(g *grpc.Server) error { fn(g); return nil }
	}
	return []component{
		{name: "tracking", grpc: register(func(g *grpc.Server) { api.RegisterTrackerServer(g, &trackerService{s: s}) })},
		{name: "admin", grpc: register(func(g *grpc.Server) { api.RegisterAdminServer(g, s.admin) })},
		{name: "movable shares", // shares.go
			build:   func() (err error) { s.shares, err = s.newShares(); return err },
			modules: func(g int) []fsm.Module { return s.shares.FSMModules(g) },
			open:    func() error { s.goUntilStop(s.shares.Run); return nil },
			addGroup: func(g int) error {
				if err := s.shares.AddGroup(g); err != nil && !errors.Is(err, sharessvc.ErrGroupExists) { // (a retry: groups.go)
					return err
				}
				return nil
			},
			grpc: register(func(g *grpc.Server) { api.RegisterSharesServer(g, &sharesService{s: s}) })},
		{name: "global rate limits", grpc: s.startRateLimit},      // ratelimit.go
		{name: "envoy rate limit service", grpc: s.startEnvoyRLS}, // envoyrls.go
		{name: "near-limit summaries", open: s.startSummaries, grpc: register(s.registerSummaries), // summaries.go
			served: func(g int) { s.summariesAddGroup(g) }},
		{name: "sketches", open: s.newSketches, grpc: register(s.registerSketches), // sketches.go
			http:  func(m *routeMux) { m.HandleFunc("GET /api/v1/sketches", s.sketches.Handler(s.cfg.Node.ID, s.log)) },
			start: s.startSketchLoops},
		{name: "runtime config", build: s.setupRuntimeConfig, // runtimeconfig.go
			modules:  func(g int) []fsm.Module { return []fsm.Module{s.rcfg.mods[g]} },
			addGroup: func(g int) error { return s.rcfg.addGroup(g) },
			grpc:     register(func(g *grpc.Server) { api.RegisterConfigServer(g, s.configServer()) }), // ReportBacklog: sampling.go
			start:    s.startRuntimeConfig},
		{name: "sampling", build: s.setupSampling, // sampling.go
			http:  func(m *routeMux) { m.Handle(sampling.BacklogPath, s.backlogHandler()) },
			start: s.startSampling},
		{name: "metering", build: func() error { s.meteringModules(); return nil }, // metering.go
			modules:  func(g int) []fsm.Module { return []fsm.Module{s.meterMods[g]} },
			addGroup: func(g int) error { s.meteringModule(g); return nil },
			open:     s.startMetering,
			grpc:     register(s.registerMetering),
			http:     func(m *routeMux) { s.mountMetering(m) },
			stop:     s.stopMetering},
		{name: "layout table", // layout.go: group 0 only
			build: s.setupLayout,
			modules: func(g int) []fsm.Module {
				if g != layouttable.OrderGroup {
					return nil
				}
				return []fsm.Module{s.layout.Module()}
			}},
		{name: "clock", grpc: register(func(g *grpc.Server) { api.RegisterClockServer(g, s.clock.Service()) })},
		s.partMovesComponent(), // partmoves.go: after the layout table and shares it reads
	}
}

// buildComponents runs every component's build, in list order.
func (s *Server) buildComponents() error {
	s.comps = s.components()
	for _, c := range s.comps {
		if c.build != nil {
			if err := c.build(); err != nil {
				return err
			}
		}
	}
	return nil
}

// fsmModules is group g's FSM modules, in list order.
func (s *Server) fsmModules(g int) []fsm.Module {
	var mods []fsm.Module
	for _, c := range s.comps {
		if c.modules != nil {
			mods = append(mods, c.modules(g)...)
		}
	}
	return mods
}

// addGroupComponents runs every component's addGroup for group g, in list
// order (groups.go).
func (s *Server) addGroupComponents(g int) error {
	for _, c := range s.comps {
		if c.addGroup != nil {
			if err := c.addGroup(g); err != nil {
				return fmt.Errorf("%s: group %d: %w", c.name, g, err)
			}
		}
	}
	return nil
}

// openComponents runs every component's open, in list order.
func (s *Server) openComponents() error {
	for _, c := range s.comps {
		if c.open != nil {
			if err := c.open(); err != nil {
				return err
			}
		}
	}
	return nil
}

// goUntilStop runs fn until the node stops (s.stop closes).
func (s *Server) goUntilStop(fn func(stop <-chan struct{})) {
	s.wg.Add(1)
	go func() { defer s.wg.Done(); fn(s.stop) }()
}
