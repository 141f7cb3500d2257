package metering

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/metering/interval"
)

// Service is metering on one node.
type Service struct {
	cfg     Config
	host    Host
	clock   *Clock
	grid    interval.Grid
	metrics *metrics
	// batchers is copy-on-write (group → batcher): events load it without
	// a lock, and grow replaces it when the host adds groups.
	batchers atomic.Pointer[[]*batcher]
	sink     *httpSink // nil without SinkURL

	stop     chan struct{}
	stopOnce sync.Once
	// growMu orders grow with Stop's close of stop: goroutines are added to
	// wg only before Stop waits on it.
	growMu sync.Mutex
	wg     sync.WaitGroup
}

// New validates cfg and starts the batchers and the per-group samplers (a
// sampler works only while this node leads its group), and those of groups
// the host adds later, while the service runs.
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
	s.batchers.Store(&[]*batcher{})
	s.grow()
	s.wg.Add(1)
	go s.watchGroups()
	return s, nil
}

// groupsPoll is how often the service looks for groups the host added: a
// raise is rare, and a sampler starting a second late loses nothing (it
// samples the replicated state), while an idle node wakes for it.
const groupsPoll = time.Second

// watchGroups starts the groups the host adds. An event starts its group
// itself (batcherOf), but that is not enough: the sampler must run on
// whichever node leads the group, and after a leadership change that node
// may hold open spans it learned only through raft and never see an event.
func (s *Service) watchGroups() {
	defer s.wg.Done()
	t := time.NewTicker(groupsPoll)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if s.host.Groups() > len(*s.batchers.Load()) {
			s.grow()
		}
	}
}

// grow starts the batcher and sampler of every group the host serves beyond
// those started so far, and returns the batchers. Once Stop has begun it
// starts nothing.
func (s *Service) grow() []*batcher {
	s.growMu.Lock()
	defer s.growMu.Unlock()
	old := *s.batchers.Load()
	n := s.host.Groups()
	select {
	case <-s.stop:
		return old
	default:
	}
	if n <= len(old) {
		return old
	}
	// A new slice, not an append: readers hold the old one.
	bs := make([]*batcher, n)
	copy(bs, old)
	for g := len(old); g < n; g++ {
		bs[g] = &batcher{s: s, g: g, in: make(chan *pendingEvent, 4*s.cfg.BatchMax), sem: make(chan struct{}, batchersInFlight)}
		s.wg.Add(2)
		go bs[g].loop()
		go s.runGroup(g)
	}
	s.batchers.Store(&bs)
	return bs
}

// batcherOf returns group g's batcher. A group added since the watcher last
// looked is started here, so its first events need not wait for the watcher.
func (s *Service) batcherOf(g int) (*batcher, error) {
	bs := *s.batchers.Load()
	if g >= len(bs) {
		bs = s.grow()
	}
	if g < 0 || g >= len(bs) {
		return nil, status.Errorf(codes.Unavailable, "group %d: not served by this node (shutting down, or the group is not started here yet); retry", g)
	}
	return bs[g], nil
}

// Clock is the service's clock.
func (s *Service) Clock() *Clock { return s.clock }

// Grid is the sampling grid (granularity and zone).
func (s *Service) Grid() interval.Grid { return s.grid }

// Stop ends the samplers and batchers (peer connections belong to the host).
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		s.growMu.Lock()
		close(s.stop)
		s.growMu.Unlock()
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
