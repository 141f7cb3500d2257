package server

import (
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/service/sampling"
)

// component is one capability as the server wires it: the gRPC services it
// registers (before Serve), the HTTP routes it mounts, what it starts once
// the node's listeners, membership and leadership watcher exist, and what it
// stops when the node stops (after gRPC stopped, before raft shuts down; in
// reverse order). A replicated capability's FSM module registers its own
// entry types (fsm.RegisterModuleEntry) and reaches the node through
// nodePort. So adding one is a state package, a service package and an
// entry in components.
type component struct {
	name  string
	grpc  func(*grpc.Server) error
	http  func(*routeMux)
	start func()
	stop  func()
}

// components is the node's capabilities, in the order they are registered
// and started.
func (s *Server) components() []component {
	register := func(fn func(*grpc.Server)) func(*grpc.Server) error {
		return func(g *grpc.Server) error { fn(g); return nil }
	}
	return []component{
		{name: "tracking", grpc: register(func(g *grpc.Server) { api.RegisterTrackerServer(g, &trackerService{s: s}) })},
		{name: "admin", grpc: register(func(g *grpc.Server) { api.RegisterAdminServer(g, s.admin) })},
		{name: "movable shares", grpc: register(func(g *grpc.Server) { api.RegisterSharesServer(g, &sharesService{s: s}) })},
		{name: "global rate limits", grpc: s.startRateLimit},      // ratelimit.go
		{name: "envoy rate limit service", grpc: s.startEnvoyRLS}, // envoyrls.go
		{name: "near-limit summaries", grpc: register(s.registerSummaries)},
		{name: "sketches", grpc: register(s.registerSketches),
			http:  func(m *routeMux) { m.HandleFunc("GET /api/v1/sketches", s.sketches.Handler(s.cfg.NodeID, s.log)) },
			start: s.startSketchLoops},
		{name: "runtime config", grpc: register(func(g *grpc.Server) { api.RegisterConfigServer(g, s.configServer()) }), // ReportBacklog: sampling.go
			start: s.startRuntimeConfig},
		{name: "sampling", http: func(m *routeMux) { m.Handle(sampling.BacklogPath, s.backlogHandler()) },
			start: s.startSampling},
		{name: "metering", grpc: register(s.registerMetering),
			http: func(m *routeMux) { s.mountMetering(m) },
			stop: s.stopMetering},
		{name: "clock", grpc: register(func(g *grpc.Server) { api.RegisterClockServer(g, &clockService{s: s}) })},
	}
}
