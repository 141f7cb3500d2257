package server

import (
	"context"
	"strings"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/rateowner"
)

// startRateLimit wires the global rate-limit owner (package rateowner): the
// RateLimit gRPC service, its tick loop and metrics. A tenant's rate state
// lives in the memory of the leader of group api.RateGroup(tenant); limits
// come from the same source as max_series: the replicated runtime config.
func (s *Server) startRateLimit() {
	s.rates = rateowner.NewService(rateowner.ServiceConfig{
		Owner:    rateowner.Config{Period: s.cfg.RatePeriod},
		Owns:     s.leads,
		LeaderOf: s.leaderOf,
		Now:      s.cfg.Clock,
		Logger:   s.log,
	}, s.cfg.Partitions, s.cfg.Groups, s.rateLimits)
	api.RegisterRateLimitServer(s.grpc, s.rates)
	s.metrics.reg.MustRegister(s.rates.Collector())
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.rates.Run(ctx) }()
	go func() { defer s.wg.Done(); <-s.closing; cancel() }()
}

// rateLimits reads a tenant's ingestion_rate / ingestion_burst (0 = off) from
// the owning group's replica of the runtime config (the file and flags while
// none is replicated), the same copy that group's leader decides series with.
func (s *Server) rateLimits(tenant string) (float64, int64) {
	g := api.RateGroup(tenant, s.cfg.Partitions, s.cfg.Groups)
	if strings.HasPrefix(tenant, envoyrl.KeyPrefix) {
		return s.envoyRate(g, tenant)
	}
	l := s.groupLimits(g).For(tenant)
	return l.IngestionRate, l.IngestionBurst
}

// defaultRatePeriod is the owners' tick, equal to the clients' default report period.
const defaultRatePeriod = 100 * time.Millisecond
