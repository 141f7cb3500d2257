package metering

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/metering/interval"
)

// Service is metering on one node.
type Service struct {
	cfg      Config
	host     Host
	clock    *Clock
	grid     interval.Grid
	metrics  *metrics
	batchers []*batcher
	sink     *httpSink // nil without SinkURL

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New validates cfg and starts the batchers and the per-group samplers (a
// sampler works only while this node leads its group).
func New(cfg Config, host Host, clock *Clock) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = NewClock(nil, cfg.TestClock)
	}
	s := &Service{cfg: cfg, host: host, clock: clock, grid: interval.Grid{G: cfg.Granularity, Loc: cfg.Location},
		stop: make(chan struct{})}
	s.metrics = newMetrics(s)
	if err := s.metrics.register(cfg.Registerer); err != nil {
		return nil, err
	}
	if cfg.SinkURL != "" {
		s.sink = &httpSink{url: cfg.SinkURL, client: &http.Client{Timeout: cfg.SinkTimeout}, m: s.metrics}
	}
	s.batchers = make([]*batcher, host.Groups())
	for g := range s.batchers {
		b := &batcher{s: s, g: g, in: make(chan *pendingEvent, 4*cfg.BatchMax), sem: make(chan struct{}, batchersInFlight)}
		s.batchers[g] = b
		s.wg.Add(2)
		go b.loop()
		go s.runGroup(g)
	}
	return s, nil
}

// Clock is the service's clock.
func (s *Service) Clock() *Clock { return s.clock }

// Grid is the sampling grid (granularity and zone).
func (s *Service) Grid() interval.Grid { return s.grid }

// Stop ends the samplers and batchers (peer connections belong to the host).
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
	})
}

// Router is where Mount adds its endpoints: an *http.ServeMux, or one that
// also records the patterns.
type Router interface {
	Handle(pattern string, h http.Handler)
	HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request))
}

// Mount adds the REST endpoints to mux; admin wraps endpoints that change
// the clock (the node's admin rule).
func (s *Service) Mount(mux Router, admin func(http.Handler) http.Handler) {
	mux.HandleFunc("POST /v1/events/start", s.handleEvent(fsmmeter.Start))
	mux.HandleFunc("POST /v1/events/stop", s.handleEvent(fsmmeter.Stop))
	mux.HandleFunc("POST /v1/events", s.handleBatch)
	mux.HandleFunc("GET /v1/usage", s.handleQuery)
	mux.HandleFunc("GET /v1/usage/bill", s.handleBill)
	mux.HandleFunc("GET /v1/metering/status", s.handleStatus)
	mux.HandleFunc("GET /v1/metering/dead-letters", s.handleDeadLetters)
	mux.Handle("POST /v1/metering/clock", admin(http.HandlerFunc(s.handleClock)))
}

// RegisterGRPC registers the Metering service.
func (s *Service) RegisterGRPC(gs *grpc.Server) { api.RegisterMeteringServer(gs, &grpcService{s: s}) }

type grpcService struct {
	api.UnimplementedMeteringServer
	s *Service
}

func (g *grpcService) Start(ctx context.Context, req *api.MeterEvent) (*api.MeterEventResponse, error) {
	return g.event(ctx, fsmmeter.Start, req)
}

func (g *grpcService) Stop(ctx context.Context, req *api.MeterEvent) (*api.MeterEventResponse, error) {
	return g.event(ctx, fsmmeter.Stop, req)
}

func (g *grpcService) event(ctx context.Context, kind fsmmeter.Kind, req *api.MeterEvent) (*api.MeterEventResponse, error) {
	ev, err := eventFromProto(kind, req)
	if err == nil {
		var resp *api.MeterEventResponse
		resp, err = g.s.Submit(ctx, ev)
		if err == nil {
			g.s.metrics.events.WithLabelValues(kindLabel(kind), "201").Inc()
			return resp, nil
		}
	}
	g.s.metrics.events.WithLabelValues(kindLabel(kind), itoa(httpCode(err))).Inc()
	return nil, err
}

func (g *grpcService) QueryUsage(ctx context.Context, req *api.QueryUsageRequest) (*api.QueryUsageResponse, error) {
	if req.Group < -1 {
		return nil, status.Errorf(codes.InvalidArgument, "group %d: want a group number, or -1 for every group", req.Group)
	}
	if req.From < 0 || req.To < 0 || (req.To != 0 && req.To < req.From) {
		return nil, status.Errorf(codes.InvalidArgument, "from %d, to %d: want 0 ≤ from ≤ to (to 0: no upper bound)", req.From, req.To)
	}
	recs, err := g.s.queryUsage(ctx, int(req.Group), fsmmeter.Filter{Target: targetFromProto(req.Target), From: req.From, To: req.To, Limit: int(req.Limit)})
	if err != nil {
		return nil, err
	}
	return &api.QueryUsageResponse{Records: recs}, nil
}

func (g *grpcService) SeriesSamples(ctx context.Context, req *api.SeriesSamplesRequest) (*api.SeriesSamplesResponse, error) {
	ss, err := g.s.seriesSamples(ctx, int(req.Group), req.Tenant, req.FromMinute, req.ToMinute, req.WithPrior)
	if err != nil {
		return nil, err
	}
	return &api.SeriesSamplesResponse{Samples: ss, PriorIncluded: req.WithPrior}, nil
}

// SetClock is the admin-only test clock (the node's gRPC interceptor applies
// the admin rule to it): FailedPrecondition on a node without the test
// clock, naming the flag that enables it.
func (g *grpcService) SetClock(ctx context.Context, req *api.SetClockRequest) (*api.SetClockResponse, error) {
	resp, err := g.s.SetClock(req.SetMs, req.AdvanceMs)
	switch {
	case errors.Is(err, ErrClockLocked):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &api.SetClockResponse{NowMs: resp.NowMs, TestClock: resp.TestClock}, nil
}

func (g *grpcService) GroupSeriesSamples(ctx context.Context, req *api.GroupSeriesSamplesRequest) (*api.GroupSeriesSamplesResponse, error) {
	ts, err := g.s.groupSeries(ctx, int(req.Group), req.FromMinute, req.ToMinute)
	if err != nil {
		return nil, err
	}
	return &api.GroupSeriesSamplesResponse{Tenants: ts}, nil
}
