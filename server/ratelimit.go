package server

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/service/ratelimit"
)

// startRateLimit wires the global rate-limit owner (package service/ratelimit): the
// RateLimit gRPC service, its tick loop and metrics. A tenant's rate state
// lives in the memory of the leader of group api.RateGroup(tenant); limits
// come from the same source as max_series: the replicated runtime config.
func (s *Server) startRateLimit(g *grpc.Server) error {
	rates, err := ratelimit.NewService(ratelimit.ServiceConfig{
		Owner:    ratelimit.Config{Period: s.cfg.RateLimit.Period, Sliding: s.envoySliding},
		Owns:     s.leads,
		LeaderOf: s.leaderOf,
		Now:      s.cfg.Clock.Now,
		Logger:   s.log,
		ClientOf: clientOfCtx,
		Layout:   s.layout.Current, // a raise's moves carry rate owners along (layout.go)
		// A moved sliding key's previous owner hands its window over
		// (service/ratelimit handoff.go), with the node's credential.
		Peer: func(addr string) (grpc.ClientConnInterface, error) { return s.peers.Conn(addr) },
	}, s.cfg.Layout.Partitions, s.base, s.rateLimits)
	if err != nil {
		return fmt.Errorf("rate-limit owner: %w", err)
	}
	s.rates = rates
	api.RegisterRateLimitServer(g, s.rates)
	api.RegisterRateAdmitServer(g, s.rates)
	s.metrics.reg.MustRegister(s.rates.Collector())
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.rates.Run(ctx) }()
	go func() { defer s.wg.Done(); <-s.closing; cancel() }()
	return nil
}

// rateLimits reads a tenant's ingestion_rate / ingestion_burst (0 = off) from
// the owning group's replica of the runtime config (the file and flags while
// none is replicated), the same copy that group's leader decides series with.
func (s *Server) rateLimits(tenant string) (float64, int64) {
	g := s.rateGroup(tenant)
	if strings.HasPrefix(tenant, envoyrl.KeyPrefix) {
		return s.envoyRate(g, tenant)
	}
	l := s.groupLimits(g).For(tenant)
	return l.IngestionRate, l.IngestionBurst
}

// rateGroup is the group whose replica of the runtime config a rate key's
// limits are read from: the key's group by the layout table once this node
// serves it, else by the arithmetic of the groups the cluster was created
// with (every group's replica holds the same config, one raft commit apart).
func (s *Server) rateGroup(key string) int {
	if g := api.RateGroupIn(key, s.layout.Current()); s.servesGroup(g) {
		return g
	}
	return api.RateGroup(key, s.cfg.Layout.Partitions, s.base)
}

// defaultRatePeriod is the owners' tick, equal to the clients' default report period.
const defaultRatePeriod = 100 * time.Millisecond
