package ratelease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
)

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// Addrs are gRPC addresses of some Tollgate nodes (seeds); the cluster
	// view names the rest.
	Addrs []string
	// Strategy, StaleAfter, FailClosed, ClientID: see LimiterConfig.
	Strategy   Strategy
	StaleAfter time.Duration
	FailClosed bool
	ClientID   uint64
	// ReportEvery is the report period; default 100ms. Owners tick at their
	// own period (--rate-period, same default): keep them equal.
	ReportEvery time.Duration
	// DialOptions replace the default (insecure transport credentials).
	DialOptions []grpc.DialOption
	// Conn, when set, gives the connection to a node instead of dialing one
	// per client: many limiters in one process (a benchmark, a multi-tenant
	// proxy) share one HTTP/2 connection per node. The client does not close
	// connections it got from Conn.
	Conn   func(addr string) (*grpc.ClientConn, error)
	Logger *slog.Logger
	Now    func() time.Time // default time.Now
}

// Client is a Limiter connected to a cluster: it keeps the cluster view, one
// Sync stream per node that leads a group, reports every ReportEvery and
// applies updates. Safe for concurrent use.
type Client struct {
	*Limiter
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	p, g    int
	table   *layout.Table  // the view's partition → group table (nil: the arithmetic of p, g)
	leaders []string       // group → leader gRPC address (view)
	hints   map[int]string // group → leader named by a redirect, until the view changes for that group
	nodes   []string       // seeds + alive members
	owners  map[string]*ownerConn
	conns   map[string]*grpc.ClientConn
	// avoid: nodes whose stream ended with Unavailable, FailedPrecondition
	// (not the leader) or a transport error, until the unix ns given. Their
	// groups go to another node meanwhile, which answers with moved_ids and a
	// redirect to the leader it knows, so a dead owner is left within one
	// report period even while the cluster view still names it.
	avoid    map[string]int64
	reroutes atomic.Uint64

	reportsSent     atomic.Uint64
	updatesReceived atomic.Uint64
	streamErrors    atomic.Uint64
}

// ownerConn is the stream to one node.
type ownerConn struct {
	addr     string
	tick     chan struct{} // 1-buffered
	tenants  atomic.Pointer[map[string]bool]
	lastSent atomic.Int64 // unix ns of the last report sent
	lastRecv atomic.Int64 // unix ns of the last update received
	up       atomic.Bool
	cancel   context.CancelFunc
}

// New starts a client. It returns at once; until the first view and updates
// arrive, Allow admits (reason "no_state").
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("ratelimit: Config.Addrs is empty: give at least one Tollgate node")
	}
	if cfg.ReportEvery == 0 {
		cfg.ReportEvery = 100 * time.Millisecond
	}
	if cfg.ReportEvery < time.Millisecond {
		return nil, fmt.Errorf("ratelimit: report period %v: must be ≥ 1ms", cfg.ReportEvery)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	l, err := NewLimiter(LimiterConfig{Strategy: cfg.Strategy, StaleAfter: cfg.StaleAfter, FailClosed: cfg.FailClosed, Now: cfg.Now, ClientID: cfg.ClientID})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{Limiter: l, cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel,
		hints: map[int]string{}, nodes: slices.Clone(cfg.Addrs), owners: map[string]*ownerConn{}, conns: map[string]*grpc.ClientConn{},
		avoid: map[string]int64{}}
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.watchLoop() }()
	go func() { defer c.wg.Done(); c.reportLoop() }()
	return c, nil
}

// Close stops the streams and releases connections.
func (c *Client) Close() error {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	if c.cfg.Conn != nil {
		return c.cfg.Conn(addr)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// watchLoop keeps a WatchCluster stream open to the known nodes in turn.
func (c *Client) watchLoop() {
	backoff := 50 * time.Millisecond
	for attempt := 0; c.ctx.Err() == nil; attempt++ {
		c.mu.Lock()
		addr := c.nodes[attempt%len(c.nodes)]
		c.mu.Unlock()
		got := c.watchOnce(addr)
		if got {
			backoff = 50 * time.Millisecond
		} else {
			backoff = min(2*backoff, 2*time.Second)
		}
		select {
		case <-time.After(backoff/2 + time.Duration(rand.Int64N(int64(backoff)))):
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *Client) watchOnce(addr string) (gotView bool) {
	cc, err := c.conn(addr)
	if err != nil {
		return false
	}
	stream, err := api.NewTrackerClient(cc).WatchCluster(c.ctx, &api.WatchClusterRequest{})
	if err != nil {
		return false
	}
	for {
		v, err := stream.Recv()
		if err != nil {
			return gotView
		}
		gotView = true
		if c.applyView(v) {
			// A group has a new leader: report to it now, not at the
			// next tick. Until its first report is in, the new owner
			// holds this client's asks for the group's sliding keys.
			c.route()
		}
	}
}

// applyView takes a cluster view; moved says whether a group's leader
// changed (from one this client knew).
func (c *Client) applyView(v *api.ClusterView) (moved bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v.Partitions == 0 || v.Groups == 0 {
		return false
	}
	c.p, c.g, c.table = int(v.Partitions), int(v.Groups), nil
	if v.Layout != nil {
		// Partitions have moved (a raise): rate owners follow the
		// table, as series do. An invalid one is ignored (the
		// arithmetic keeps routing; owners redirect what moved).
		if t, err := api.ViewTable(v); err == nil {
			c.table, c.g = t, t.Groups
		} else {
			c.log.Warn("rate limit: cluster view's layout ignored", "err", err)
		}
	}
	leaders := make([]string, c.g)
	for _, gi := range v.GroupInfo {
		if int(gi.Group) < c.g {
			leaders[gi.Group] = gi.LeaderGrpcAddress
		}
	}
	for g, addr := range leaders {
		if g < len(c.leaders) && c.leaders[g] != addr {
			moved = moved || addr != ""
			delete(c.hints, g) // the view moved on: trust it again
			// A node the view now names a group's new leader is no
			// longer passed over: its stream may have ended while it
			// was still a follower (during the election), and waiting
			// out avoidFor would keep the group's tenants off their new
			// owner for up to 3 s after a failover.
			if addr != "" {
				delete(c.avoid, addr)
			}
		}
	}
	c.leaders = leaders
	nodes := slices.Clone(c.cfg.Addrs)
	for _, m := range v.Members {
		if m.GrpcAddress != "" && m.Status == "alive" && !slices.Contains(nodes, m.GrpcAddress) {
			nodes = append(nodes, m.GrpcAddress)
		}
	}
	c.nodes = nodes
	return moved
}

// reportLoop ticks the limiter, routes every tenant to its owner and wakes
// the owner streams.
func (c *Client) reportLoop() {
	t := time.NewTicker(c.cfg.ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			c.mu.Lock()
			for _, oc := range c.owners {
				oc.cancel()
			}
			c.mu.Unlock()
			return
		case <-t.C:
		}
		c.Tick(c.cfg.Now())
		c.route()
	}
}

func (c *Client) route() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.g == 0 {
		return
	}
	sets := map[string]map[string]bool{}
	ns := c.cfg.Now().UnixNano()
	for a, until := range c.avoid {
		if ns >= until {
			delete(c.avoid, a)
		}
	}
	// Every leader gets a stream, even with no tenant of ours: the heartbeat
	// makes this client count as active (Local strategy).
	for g, a := range c.leaders {
		if a = c.usable(g, a); a != "" && sets[a] == nil {
			sets[a] = map[string]bool{}
		}
	}
	for _, t := range *c.byID.Load() {
		g := c.groupOf(t.name)
		addr := c.hints[g]
		if addr == "" {
			addr = c.leaders[g]
		}
		addr = c.usable(g, addr)
		if addr == "" {
			continue // no known owner: the tenant goes stale, then fails open/closed
		}
		if sets[addr] == nil {
			sets[addr] = map[string]bool{}
		}
		sets[addr][t.name] = true
	}
	for addr, oc := range c.owners {
		if sets[addr] == nil {
			oc.cancel()
			delete(c.owners, addr)
		}
	}
	for addr, set := range sets {
		oc := c.owners[addr]
		if oc == nil {
			ctx, cancel := context.WithCancel(c.ctx)
			oc = &ownerConn{addr: addr, tick: make(chan struct{}, 1), cancel: cancel}
			c.owners[addr] = oc
			c.wg.Add(1)
			go func() { defer c.wg.Done(); c.ownerLoop(ctx, oc) }()
		}
		oc.tenants.Store(&set)
		select {
		case oc.tick <- struct{}{}:
		default:
		}
	}
}

// usable returns addr, or when addr is avoided another node that is not
// (chosen by group, so a group's tenants stay together); "" when none is.
// c.mu held.
func (c *Client) usable(g int, addr string) string {
	if addr == "" || c.avoid[addr] == 0 {
		return addr
	}
	for i := range c.nodes {
		if a := c.nodes[(g+i)%len(c.nodes)]; a != addr && c.avoid[a] == 0 {
			return a
		}
	}
	return ""
}

// rerouteOn: the stream errors after which a node is avoided for a while.
func rerouteOn(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.FailedPrecondition, codes.Canceled:
		return true
	}
	return false
}

// avoidFor is how long a node that failed a stream is passed over; the
// cluster view naming a different leader for its groups ends it earlier.
const avoidFor = 3 * time.Second

// ownerLoop keeps one Sync stream to a node, reconnecting with backoff. A new
// stream re-introduces tenant names and the owner re-seeds the window from
// this client's bucket counts (failover).
func (c *Client) ownerLoop(ctx context.Context, oc *ownerConn) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := c.syncOnce(ctx, oc)
		oc.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		c.streamErrors.Add(1)
		c.log.Debug("ratelimit: report stream ended", "addr", oc.addr, "err", err)
		c.mu.Lock()
		for g, a := range c.hints {
			if a == oc.addr {
				delete(c.hints, g)
			}
		}
		if rerouteOn(err) {
			c.avoid[oc.addr] = c.cfg.Now().Add(avoidFor).UnixNano()
			c.reroutes.Add(1)
		}
		c.mu.Unlock()
		if rerouteOn(err) {
			c.route() // move its tenants now rather than at the next tick
		}
		select {
		case <-time.After(backoff/2 + time.Duration(rand.Int64N(int64(backoff)))):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Client) syncOnce(ctx context.Context, oc *ownerConn) error {
	cc, err := c.conn(oc.addr)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := api.NewRateLimitClient(cc).Sync(sctx)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			u, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			now := c.cfg.Now()
			moved, err := c.Apply(u, now)
			if err != nil {
				recvErr <- err
				return
			}
			oc.lastRecv.Store(now.UnixNano())
			oc.up.Store(true)
			c.updatesReceived.Add(1)
			if (len(moved) > 0 || len(u.Redirects) > 0) && c.redirect(oc.addr, u.Redirects) {
				c.route() // to the named owner now, not at the next tick
			}
		}
	}()
	st := NewReportState()
	for {
		select {
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-oc.tick:
		}
		set := *oc.tenants.Load()
		rep := c.Report(st, func(name string) bool { return set[name] })
		if err := stream.Send(rep); err != nil {
			return err
		}
		oc.lastSent.Store(c.cfg.Now().UnixNano())
		c.reportsSent.Add(1)
	}
}

// groupOf is the group owning key's rate state (c.mu held).
func (c *Client) groupOf(key string) int {
	if c.table != nil {
		return api.RateGroupIn(key, c.table)
	}
	return api.RateGroup(key, c.p, c.g)
}

// redirect follows an owner's "not mine": the next route sends the group's
// tenants to the named leader (or back to the view's when none is named).
// It reports whether a group's hint now names another node.
func (c *Client) redirect(from string, rs []*api.RateRedirect) (changed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		g := int(r.Group)
		old, had := c.hints[g]
		if r.LeaderGrpcAddress != "" && r.LeaderGrpcAddress != from {
			c.hints[g] = r.LeaderGrpcAddress
			changed = changed || old != r.LeaderGrpcAddress
		} else {
			delete(c.hints, g)
			changed = changed || had
		}
	}
	return changed
}

// Stats is a snapshot of the client's counters.
type Stats struct {
	Allowed, Blocked uint64 // requests
	// FailedOpen counts requests admitted because their owner was silent
	// longer than StaleAfter; FailingOpen is true while some tenant is in that
	// state (and the client is not FailClosed).
	FailedOpen  uint64
	FailingOpen bool
	StaleTenant int // tenants whose owner is silent longer than StaleAfter
	Blocklisted int // tenants blocked now (Blocklist strategy)
	Owners      int // owner streams that delivered an update
	// ReportLag is the longest time since a report was sent to an owner
	// stream; UpdateAge the longest since one sent an update.
	ReportLag, UpdateAge time.Duration
	ReportsSent          uint64
	UpdatesReceived      uint64
	StreamErrors         uint64
	// Reroutes counts owner streams that ended with Unavailable,
	// FailedPrecondition or a transport error, after which the node's groups
	// went to another node for a while.
	Reroutes uint64
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := c.Limiter.stats()
	ns := c.cfg.Now().UnixNano()
	c.mu.Lock()
	for _, oc := range c.owners {
		if oc.up.Load() {
			s.Owners++
		}
		if t := oc.lastSent.Load(); t != 0 {
			s.ReportLag = max(s.ReportLag, time.Duration(ns-t))
		}
		if t := oc.lastRecv.Load(); t != 0 {
			s.UpdateAge = max(s.UpdateAge, time.Duration(ns-t))
		}
	}
	c.mu.Unlock()
	s.ReportsSent, s.UpdatesReceived, s.StreamErrors = c.reportsSent.Load(), c.updatesReceived.Load(), c.streamErrors.Load()
	s.Reroutes = c.reroutes.Load()
	return s
}

// stats sums the per-tenant counters.
func (l *Limiter) stats() Stats {
	var s Stats
	ns := l.now().UnixNano()
	for _, t := range *l.byID.Load() {
		for r := range numReasons {
			v := t.decided[r].Load()
			if reasonAllowed(r) {
				s.Allowed += v
			} else {
				s.Blocked += v
			}
		}
		s.FailedOpen += t.decided[reasonFailOpen].Load()
		if t.mode.Load() == modeStale {
			s.StaleTenant++
		}
		if t.blockedUntil.Load() > ns {
			s.Blocklisted++
		}
	}
	s.FailingOpen = s.StaleTenant > 0 && !l.cfg.FailClosed
	return s
}

// Stats returns the core's counters (no transport figures).
func (l *Limiter) Stats() Stats { return l.stats() }
