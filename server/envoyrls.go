package server

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/ratelease"
	"github.com/tollgate-io/tollgate/service/envoyrls"
)

// startEnvoyRLS registers Envoy's rate limit service (service/envoyrls) and
// starts the node's lease client. It runs before the gRPC server serves;
// the client's first streams retry until it does.
func (s *Server) startEnvoyRLS(g *grpc.Server) error {
	addr := s.cfg.Node.GRPCAdvertise
	if addr == "" {
		addr = advertiseOf(s.grpcLis.Addr())
	}
	client, err := ratelease.New(ratelease.Config{
		Addrs:       []string{addr},
		Strategy:    ratelease.Lease,
		ReportEvery: s.cfg.RateLimit.Period,
		Conn:        s.admin.conn, // peer credentials (TLS like every node-to-node call)
		Logger:      s.log.With("part", "envoy-rls"),
		Now:         s.cfg.Clock.Now,
	})
	if err != nil {
		return fmt.Errorf("envoy rate limit service: %w", err)
	}
	s.rls = envoyrls.New(envoyrls.Config{Client: client, Newest: s.RuntimeConfig, Logger: s.log, Registerer: s.metrics.reg})
	rlsv3.RegisterRateLimitServiceServer(g, s.rls)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); <-s.closing; _ = client.Close() }()
	return nil
}

// envoyRate is the owner-side limit of an Envoy counter key, from group g's
// replica of the runtime config.
func (s *Server) envoyRate(g int, key string) (float64, int64) {
	return s.ownerRules.Rate(s.rcfg.mods[g].Current(), key)
}

// envoySliding says whether an Envoy counter key's rule is a sliding window,
// from its rate group's replica.
func (s *Server) envoySliding(key string) bool {
	return s.ownerRules.Sliding(s.rcfg.mods[s.rateGroup(key)].Current(), key)
}
