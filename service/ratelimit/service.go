package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/tenantscope"
)

// ServiceConfig wires the owner core to a node.
type ServiceConfig struct {
	Owner Config
	// Owns reports whether this node leads raft group g now.
	Owns func(g int) bool
	// LeaderOf names group g's leader (id, gRPC address; "" when unknown).
	LeaderOf func(g int) (id, addr string)
	Now      func() time.Time // default time.Now
	Logger   *slog.Logger
	// ClientOf names the caller of a stream for MaxTenantsPerClient (its
	// credential, or its address); nil: every stream is its own client.
	ClientOf func(ctx context.Context) string
	// MaxTenantsPerClient bounds the tenant names one client's open streams
	// on this node introduced, together (default 200,000): each name holds
	// state on the node for the stream's life, so many streams of many
	// names would otherwise spend the node's memory without bound.
	MaxTenantsPerClient int
}

// Service is the RateLimit gRPC service of one node plus its tick loop.
type Service struct {
	api.UnimplementedRateLimitServer
	cfg     ServiceConfig
	o       *Owner
	closing chan struct{}

	reports   atomic.Uint64
	rejected  atomic.Uint64 // streams ended by bad input
	tickNanos atomic.Int64
	owned     atomic.Int64 // tenants owned, last tick
	blocked   atomic.Int64 // tenants blocked, last tick
	// limited tenants, their summed window rate and limit (float64 bits), last tick
	limited                   atomic.Int64
	limitedRate, limitedLimit atomic.Uint64
	sessions                  atomic.Int64

	budgetMu sync.Mutex
	budget   map[string]int // tenant names introduced by each client's open streams
}

// NewService returns a service for p partitions in g groups, or an error
// naming a field of cfg.Owner out of range.
func NewService(cfg ServiceConfig, p, g int, limits Limits) (*Service, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxTenantsPerClient <= 0 {
		cfg.MaxTenantsPerClient = 200_000
	}
	o, err := New(cfg.Owner, p, g, limits)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, o: o, closing: make(chan struct{}), budget: map[string]int{}}, nil
}

// Run ticks the owner every period until ctx ends, then ends every stream
// with Unavailable so clients move to another node.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.o.cfg.Period)
	defer t.Stop()
	defer close(s.closing)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			start := time.Now()
			s.o.Tick(s.cfg.Now(), s.cfg.Owns, s.cfg.LeaderOf)
			s.tickNanos.Store(int64(time.Since(start)))
			c := s.o.counts(s.cfg.Now().UnixNano())
			s.owned.Store(int64(c.owned))
			s.blocked.Store(int64(c.blocked))
			s.limited.Store(int64(c.limited))
			s.limitedRate.Store(math.Float64bits(c.limitedRate))
			s.limitedLimit.Store(math.Float64bits(c.limitedLimit))
		}
	}
}

// ownerCounts is what the owner's metrics report after a tick.
type ownerCounts struct {
	owned, blocked int
	// limited: owned tenants whose clients asked for more than the limit
	// left in the last tick; their sliding-window rate (as reported by the
	// clients) and their limits, summed, in requests per second.
	limited                   int
	limitedRate, limitedLimit float64
}

// counts returns the tenants owned, blocked and limited (tick goroutine
// only, or after it stopped).
func (o *Owner) counts(ns int64) ownerCounts {
	var c ownerCounts
	for k := range o.shards {
		o.shards[k].mu.Lock()
		o.shards[k].countInto(&c, ns)
		o.shards[k].mu.Unlock()
	}
	return c
}

// countInto adds the shard's tenants to c (sh.mu held).
func (sh *shard) countInto(c *ownerCounts, ns int64) {
	for _, t := range sh.list {
		if !t.owned {
			continue
		}
		c.owned++
		if t.blockedTil > ns {
			c.blocked++
		}
		if t.scarce && t.rate > 0 && t.window > 0 && !math.IsInf(t.rate, 1) {
			span := float64(t.window) / 1e9
			curAge := min(max(float64(ns-t.curStart)/1e9, 0), span)
			c.limited++
			c.limitedRate += (t.prev*((span-curAge)/span) + t.cur) / span
			c.limitedLimit += t.rate
		}
	}
}

// Sync serves one client's stream: reports in, updates out.
func (s *Service) Sync(stream grpc.BidiStreamingServer[api.RateReport, api.RateUpdate]) error {
	sess := s.o.NewSession()
	s.sessions.Add(1)
	defer s.sessions.Add(-1)
	defer sess.Close()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				sendErr <- nil
				return
			case <-sess.Notify():
				if u := sess.Take(); u != nil {
					if err := stream.Send(u); err != nil {
						sendErr <- err
						cancel()
						return
					}
					sess.Recycle(u) // Send has encoded it

				}
			}
		}
	}()
	client := fmt.Sprintf("stream %p", sess)
	if s.cfg.ClientOf != nil {
		client = s.cfg.ClientOf(stream.Context())
	}
	var held atomic.Int64 // names this stream took from the client's budget
	defer func() { s.release(client, int(held.Load())) }()
	recvErr := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			// The names a report introduces are the tenants it touches:
			// a credential limited to tenants may introduce only its own
			// (tenantscope; the node's access check cannot see them).
			if err := tenantscope.Check(stream.Context(), "new_names", r.NewNames...); err != nil {
				recvErr <- err
				return
			}
			if n := len(r.NewNames); n > 0 {
				if err := s.take(client, n); err != nil {
					recvErr <- err
					return
				}
				held.Add(int64(n))
			}
			if err := sess.Absorb(r, s.cfg.Now()); err != nil {
				recvErr <- err
				return
			}
			s.reports.Add(1)
		}
	}()
	var err error
	select {
	case err = <-recvErr:
	case err = <-sendErr:
	case <-s.closing:
		return status.Error(codes.Unavailable, "node is shutting down; send rate reports to the new owner")
	}
	cancel()
	switch {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, ErrTooMany):
		s.rejected.Add(1)
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, ErrInvalid):
		s.rejected.Add(1)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return err
}

// take counts n more tenant names against client's budget, or refuses
// with ResourceExhausted naming the bound.
func (s *Service) take(client string, n int) error {
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	if s.budget[client]+n > s.cfg.MaxTenantsPerClient {
		s.rejected.Add(1)
		return status.Errorf(codes.ResourceExhausted, "%s: its open rate-report streams on this node would name %d tenants, at most %d per client; close streams it no longer uses",
			client, s.budget[client]+n, s.cfg.MaxTenantsPerClient)
	}
	s.budget[client] += n
	return nil
}

func (s *Service) release(client string, n int) {
	if n == 0 {
		return
	}
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	if s.budget[client] -= n; s.budget[client] <= 0 {
		delete(s.budget, client)
	}
}

// Collector exports the owner's state for Prometheus.
func (s *Service) Collector() prometheus.Collector { return &collector{s: s} }

var (
	descOwned    = prometheus.NewDesc("tollgate_ratelimit_owner_tenants", "Tenants whose rate state this node owns (leads their rate group).", nil, nil)
	descBlocked  = prometheus.NewDesc("tollgate_ratelimit_owner_blocklist_size", "Owned tenants over their limit now (sliding-window rate above the limit).", nil, nil)
	descSessions = prometheus.NewDesc("tollgate_ratelimit_owner_streams", "Open client rate-report streams.", nil, nil)
	descReports  = prometheus.NewDesc("tollgate_ratelimit_owner_reports_total", "Rate reports absorbed.", nil, nil)
	descRejected = prometheus.NewDesc("tollgate_ratelimit_owner_invalid_streams_total", "Streams ended because a report was invalid.", nil, nil)
	descTick     = prometheus.NewDesc("tollgate_ratelimit_owner_tick_seconds", "Duration of the last tick (fold reports, build updates).", nil, nil)
	descLimited  = prometheus.NewDesc("tollgate_ratelimit_owner_limited_tenants", "Owned tenants whose clients asked for more than their limit in the last tick.", nil, nil)
	descLimRate  = prometheus.NewDesc("tollgate_ratelimit_owner_limited_admitted_per_second", "Sliding-window rate admitted for the limited tenants (as their clients report it), summed: compare with tollgate_ratelimit_owner_limited_limit_per_second.", nil, nil)
	descLimLimit = prometheus.NewDesc("tollgate_ratelimit_owner_limited_limit_per_second", "Rate limits of the limited tenants, summed.", nil, nil)
)

type collector struct{ s *Service }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOwned, descBlocked, descSessions, descReports, descRejected, descTick, descLimited, descLimRate, descLimLimit} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, float64(s.owned.Load()))
	ch <- prometheus.MustNewConstMetric(descBlocked, prometheus.GaugeValue, float64(s.blocked.Load()))
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.sessions.Load()))
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(s.reports.Load()))
	ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(s.rejected.Load()))
	ch <- prometheus.MustNewConstMetric(descTick, prometheus.GaugeValue, float64(s.tickNanos.Load())/1e9)
	ch <- prometheus.MustNewConstMetric(descLimited, prometheus.GaugeValue, float64(s.limited.Load()))
	ch <- prometheus.MustNewConstMetric(descLimRate, prometheus.GaugeValue, math.Float64frombits(s.limitedRate.Load()))
	ch <- prometheus.MustNewConstMetric(descLimLimit, prometheus.GaugeValue, math.Float64frombits(s.limitedLimit.Load()))
}

// Admit serves RateAdmit.Admit (api.RateAdmitMethod): the owner decides a
// sliding-window key's request now, for a client whose lease does not cover
// it. Not the owner: a redirect to the leader it knows, no decision.
func (s *Service) Admit(ctx context.Context, r *api.RateReport) (*api.RateUpdate, error) {
	if len(r.NewNames) != 1 || len(r.ConsumedTotal) != 1 {
		return nil, status.Errorf(codes.InvalidArgument, "admit: want one key in new_names and its tokens in consumed_total, got %d and %d", len(r.NewNames), len(r.ConsumedTotal))
	}
	key := r.NewNames[0]
	if err := api.ValidateTenantID(key); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "admit: new_names[0]: %v", err)
	}
	select {
	case <-s.closing:
		return nil, status.Error(codes.Unavailable, "node is shutting down; ask the new owner")
	default:
	}
	g := api.RateGroup(key, s.o.p, s.o.g)
	from := Asker{ID: r.ClientId}
	if len(r.BucketConsumed) == 2 {
		from.Known, from.Consumed, from.Cap = true, r.BucketConsumed[0], r.BucketConsumed[1]
	}
	res, err := s.o.Admit(key, r.ConsumedTotal[0], s.cfg.Now(), s.cfg.Owns(g), from)
	switch {
	case errors.Is(err, ErrNotOwner):
		id, addr := s.cfg.LeaderOf(g)
		return &api.RateUpdate{Redirects: []*api.RateRedirect{{Group: uint32(g), LeaderId: id, LeaderGrpcAddress: addr}}}, nil
	case err != nil:
		return nil, err
	}
	u := &api.RateUpdate{Cap: []uint64{0, res.Remaining}, BlockedForNanos: []int64{int64(res.NextFree)}}
	if res.Admitted {
		u.Cap[0] = 1
	}
	return u, nil
}
