package clientlib

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Client tracks series against a Tollgate cluster. It is safe for concurrent
// use. Create it with New and release it with Close.
type Client struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines (watch, poller, async requests)

	layoutKnown chan struct{} // closed once p, g (or layoutErr) are set
	layoutTimer *time.Timer   // sets the configured layout if no view came first

	mu     sync.Mutex
	closed bool
	conns  map[string]*grpc.ClientConn
	p, g   int // layout; 0 until known
	// table is the partition → group table requests are routed by: the
	// arithmetic of (p, g) until a view carries a layout, then the
	// highest-epoch layout seen (watch.go); nil until p, g are known.
	table     atomic.Pointer[api.Table]
	layoutErr error // permanent: layout mismatch
	// watchErr is why the last WatchCluster attempt brought no view (nil
	// once one did); watchErrCh is closed and replaced when it changes, so
	// callers waiting for the layout learn of a refused credential at once
	// instead of at their deadline.
	watchErr   error
	watchErrCh chan struct{}
	leaders    []string
	// leaderWake[g] is closed (and replaced) when group g's leader becomes a
	// new, known address: retries of g's requests waiting out a backoff go
	// at once (a failover is over when the new leader is known, not when
	// the longest backoff ends).
	leaderWake []chan struct{}
	nodes      []string   // seeds, then alive members (deduplicated)
	members    []member   // from the latest view
	voters     [][]string // per group: raft ids of its voters, from the latest view

	rcfg runtimeConfigState // runtimeconfig.go

	near   atomic.Pointer[nearTable]
	nearMu sync.Mutex    // serializes writers of near
	rr     atomic.Uint64 // round robin over nodes

	summarySeed    maphash.Seed // this client's order of nodes for summary streams
	summaryPolling atomic.Bool  // a node answered Unimplemented: polling instead

	stats stats

	// onBackoff, when set (tests only), sees every backoff wait send
	// requests before it starts.
	onBackoff func(time.Duration)
}

type member struct {
	id, addr, status string
}

type stats struct {
	requests, retries, notLeader, attemptTimeouts atomic.Uint64
	leaderWakes                                   atomic.Uint64
	syncReq, asyncReq                             atomic.Uint64
	failedOpen, errors                            atomic.Uint64
	asyncLate, asyncLateRejected, asyncLateErrors atomic.Uint64
	watchReconnects, watchViews                   atomic.Uint64
	nearLimitPolls, nearLimitPollErrors           atomic.Uint64
	summaryUpdates, summaryStale, summaryBreaks   atomic.Uint64
	summaryOpened                                 atomic.Uint64
	summaryStreams                                atomic.Int64
	configUpdates                                 atomic.Uint64
	moved                                         atomic.Uint64
}

// Stats is a snapshot of the client's counters (monotonic since New) and gauges.
type Stats struct {
	// Requests counts partition requests: one per non-empty partition of a
	// TrackSeries call, one per TrackPartition call.
	Requests uint64
	// SyncRequests and AsyncRequests split Requests by how they were waited for.
	SyncRequests, AsyncRequests uint64
	// Retries counts re-sent RPCs (every attempt after a request's first).
	Retries uint64
	// NotLeaderRedirects counts NotLeader answers (with or without a hint).
	NotLeaderRedirects uint64
	// Moved counts Moved answers: the partition had moved to another group
	// (the layout table changed) and the request was sent again to its
	// owner. They are never surfaced as errors.
	Moved uint64
	// AttemptTimeouts counts attempts abandoned after Config.AttemptTimeout
	// without an answer (a node cut off by a partition, or frozen).
	AttemptTimeouts uint64
	// LeaderWakes counts backoff waits cut short because the group's new
	// leader became known (from the cluster watch or another request's
	// redirect).
	LeaderWakes uint64
	// FailedOpen counts partition requests that failed and, with FailOpen,
	// were answered "no rejections" (plus whole calls made before the layout
	// could be learned).
	FailedOpen uint64
	// Errors counts partition requests whose failure was returned to the
	// caller (plus whole calls that failed before the layout was known).
	Errors uint64
	// AsyncLate counts async answers that came after the caller stopped
	// waiting; AsyncLateRejected the hashes those answers rejected (series
	// that were let through although over the limit); AsyncLateErrors the
	// background requests that finally failed.
	AsyncLate, AsyncLateRejected, AsyncLateErrors uint64
	// WatchReconnects counts attempts to open a WatchCluster stream after the
	// first one (the previous stream broke, or could not be opened);
	// WatchViews the cluster views applied.
	WatchReconnects, WatchViews uint64
	// NearLimitPolls and NearLimitPollErrors count GetUsersCloseToLimit calls
	// (made only while the servers do not implement WatchSummaries).
	NearLimitPolls, NearLimitPollErrors uint64
	// SummaryUpdates counts WatchSummaries updates received; SummaryStale the
	// group summaries ignored because the client already held that group at a
	// higher applied index; SummaryStreamBreaks the streams a node ended (or
	// that could not be opened), after which their groups moved to other nodes.
	SummaryUpdates, SummaryStale, SummaryStreamBreaks uint64
	// SummaryStreamsOpened counts WatchSummaries streams started (re-plans
	// after view changes and reconnections included).
	SummaryStreamsOpened uint64
	// SummaryStreams is the number of WatchSummaries streams delivering now.
	SummaryStreams int
	// SummaryPolling is true while the client polls GetUsersCloseToLimit
	// because a node answered WatchSummaries with Unimplemented.
	SummaryPolling bool
	// ConfigUpdates counts runtime configuration versions received;
	// ConfigVersion is the newest one (0: none).
	ConfigUpdates, ConfigVersion uint64
	// LeaderTableSize is the number of groups whose leader is known now.
	LeaderTableSize int
	// NearLimit is the number of (group, tenant) pairs now treated as near
	// their limit.
	NearLimit int
}

// New validates cfg, applies its defaults and starts the background work (the
// WatchCluster stream and, in ModeAuto, the near-limit summary streams). Connections
// are opened lazily: New does not fail because nodes are unreachable.
func New(cfg Config) (*Client, error) {
	cfg.Addrs = slices.Clone(cfg.Addrs)
	cfg.DialOptions = slices.Clone(cfg.DialOptions)
	if cfg.Token != "" {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithPerRPCCredentials(bearerToken(cfg.Token)))
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		cfg:         cfg,
		log:         cfg.Logger,
		layoutKnown: make(chan struct{}),
		watchErrCh:  make(chan struct{}),
		conns:       map[string]*grpc.ClientConn{},
		summarySeed: maphash.MakeSeed(),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, a := range cfg.Addrs {
		if !slices.Contains(c.nodes, a) {
			c.nodes = append(c.nodes, a)
		}
	}
	c.near.Store(&nearTable{})
	if cfg.Partitions > 0 && cfg.Groups > 0 {
		// Calls wait for the first watch outcome so that a cluster with
		// another layout is reported as such, but never long: an unreachable
		// seed must not hold up the configured layout.
		c.layoutTimer = time.AfterFunc(layoutGrace, c.layoutFromConfig)
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.watchLoop() }()
	if cfg.Mode == ModeAuto {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.nearLoop() }()
	}
	return c, nil
}

// Close stops the background work, cancels requests still running in the
// background and closes every connection. Calls in flight fail with ErrClosed
// (or a Canceled status). Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.layoutTimer != nil {
		c.layoutTimer.Stop()
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

// Layout returns the cluster's partitions and groups, or zeros while unknown.
func (c *Client) Layout() (partitions, groups int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.p, c.g
}

// WaitReady waits until the cluster layout is known (from the configuration,
// the first ClusterView, or the defaults when WatchCluster is unimplemented).
// It returns a *LayoutError if the cluster disagrees with the configuration.
// Calling it is optional: tracking calls wait for the layout themselves.
func (c *Client) WaitReady(ctx context.Context) error {
	_, _, err := c.layout(ctx)
	return err
}

// layout waits for the layout within ctx. A node that refuses the client's
// credential (Unauthenticated, PermissionDenied on WatchCluster) ends the wait
// at once with that error: waiting would only turn it into a timeout that
// never mentions the credential.
func (c *Client) layout(ctx context.Context) (p, g int, err error) {
	for known := false; !known; {
		c.mu.Lock()
		werr, changed := c.watchErr, c.watchErrCh
		c.mu.Unlock()
		if isCredentialErr(werr) {
			select {
			case <-c.layoutKnown: // a view came meanwhile after all
			default:
				return 0, 0, fmt.Errorf("clientlib: the cluster refuses this client's credential (check the token or client certificate): %w", werr)
			}
		}
		select {
		case <-c.layoutKnown:
			known = true
		case <-changed:
		case <-ctx.Done():
			if werr != nil {
				return 0, 0, fmt.Errorf("clientlib: cluster layout not known yet (no ClusterView received; last WatchCluster attempt: %v): %w", werr, ctxStatusErr(ctx))
			}
			return 0, 0, fmt.Errorf("clientlib: cluster layout not known yet (no ClusterView received): %w", ctxStatusErr(ctx))
		case <-c.ctx.Done():
			return 0, 0, closedErr{}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.layoutErr != nil {
		return 0, 0, c.layoutErr
	}
	return c.p, c.g, nil
}

// setWatchErr records the outcome of a WatchCluster attempt (nil: a view
// came) and wakes the callers waiting in layout.
func (c *Client) setWatchErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchErr = err
	close(c.watchErrCh)
	c.watchErrCh = make(chan struct{})
}

// isCredentialErr reports a refusal of the client's credential: retrying
// with the same one cannot help.
func isCredentialErr(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// layoutGrace is how long, with Config.Partitions and Groups set, calls wait
// for the first WatchCluster outcome before using the configured layout.
const layoutGrace = time.Second

// layoutFromConfig uses the configured layout if none is known yet.
func (c *Client) layoutFromConfig() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == 0 && c.layoutErr == nil && c.cfg.Partitions > 0 && c.cfg.Groups > 0 {
		c.setLayoutLocked(c.cfg.Partitions, c.cfg.Groups)
	}
}

// setLayoutLocked fixes the layout and sizes the per-group tables.
func (c *Client) setLayoutLocked(p, g int) {
	c.p, c.g = p, g
	c.table.Store(api.ArithmeticTable(p, g))
	c.leaders = make([]string, g)
	c.leaderWake = make([]chan struct{}, g)
	for i := range c.leaderWake {
		c.leaderWake[i] = make(chan struct{})
	}
	if len(c.voters) != g {
		c.voters = make([][]string, g)
	}
	c.near.Store(newNearTable(g))
	close(c.layoutKnown)
}

// maxGroups bounds the groups a table or a Moved answer may name (the
// server's layout.MaxPartitions bounds them far lower).
const maxGroups = 1 << 16

// growGroupsLocked sizes the per-group leader tables for n groups: a raise
// adds groups to a running cluster, named first by its layout table or by a
// Moved answer.
func (c *Client) growGroupsLocked(n int) {
	for len(c.leaders) < n {
		c.leaders = append(c.leaders, "")
		c.leaderWake = append(c.leaderWake, make(chan struct{}))
	}
	for len(c.voters) < n {
		c.voters = append(c.voters, nil)
	}
}

// failLayoutLocked records a permanent layout error.
func (c *Client) failLayoutLocked(err error) {
	if c.layoutErr != nil {
		return
	}
	c.layoutErr = err
	c.log.Error("clientlib: unusable cluster layout", "err", err)
	select {
	case <-c.layoutKnown:
	default:
		close(c.layoutKnown)
	}
}

// conn returns the connection to addr, opening it if needed.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, closedErr{}
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, c.cfg.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("clientlib: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

func (c *Client) tracker(addr string) (api.TrackerClient, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	return api.NewTrackerClient(cc), nil
}

// leaderOf returns the known leader address of group g, or "".
func (c *Client) leaderOf(g int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g < len(c.leaders) {
		return c.leaders[g]
	}
	return ""
}

// setLeaderLocked records addr as leader of g and wakes g's waiting retries
// when it is a new known leader.
func (c *Client) setLeaderLocked(g int, addr string) {
	if g >= len(c.leaders) {
		return
	}
	if addr != "" && c.leaders[g] != addr && g < len(c.leaderWake) {
		close(c.leaderWake[g])
		c.leaderWake[g] = make(chan struct{})
	}
	c.leaders[g] = addr
}

// leaderChanged is closed when group g's leader next becomes a new known
// address (nil before the layout is known: never).
func (c *Client) leaderChanged(g int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g < len(c.leaderWake) {
		return c.leaderWake[g]
	}
	return nil
}

// setLeader records addr as leader of g ("" = unknown).
func (c *Client) setLeader(g int, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLeaderLocked(g, addr)
	if addr != "" && !slices.Contains(c.nodes, addr) {
		c.nodes = append(c.nodes, addr)
	}
}

// forgetLeader clears g's leader if it is still addr.
func (c *Client) forgetLeader(g int, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g < len(c.leaders) && c.leaders[g] == addr {
		c.leaders[g] = ""
	}
}

// anyNode returns a known node, rotating, avoiding avoid when there is a choice.
func (c *Client) anyNode(avoid string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.nodes)
	i := int(c.rr.Add(1) % uint64(n))
	if c.nodes[i] == avoid && n > 1 {
		i = (i + 1) % n
	}
	return c.nodes[i]
}

// Stats returns the current counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	out := Stats{
		Requests:             s.requests.Load(),
		SyncRequests:         s.syncReq.Load(),
		AsyncRequests:        s.asyncReq.Load(),
		Retries:              s.retries.Load(),
		AttemptTimeouts:      s.attemptTimeouts.Load(),
		LeaderWakes:          s.leaderWakes.Load(),
		NotLeaderRedirects:   s.notLeader.Load(),
		Moved:                s.moved.Load(),
		FailedOpen:           s.failedOpen.Load(),
		Errors:               s.errors.Load(),
		AsyncLate:            s.asyncLate.Load(),
		AsyncLateRejected:    s.asyncLateRejected.Load(),
		AsyncLateErrors:      s.asyncLateErrors.Load(),
		WatchReconnects:      s.watchReconnects.Load(),
		WatchViews:           s.watchViews.Load(),
		NearLimitPolls:       s.nearLimitPolls.Load(),
		NearLimitPollErrors:  s.nearLimitPollErrors.Load(),
		SummaryUpdates:       s.summaryUpdates.Load(),
		SummaryStale:         s.summaryStale.Load(),
		SummaryStreamBreaks:  s.summaryBreaks.Load(),
		SummaryStreams:       int(s.summaryStreams.Load()),
		SummaryStreamsOpened: s.summaryOpened.Load(),
		SummaryPolling:       c.summaryPolling.Load(),
		ConfigUpdates:        s.configUpdates.Load(),
		ConfigVersion:        c.RuntimeConfig().Version(),
		NearLimit:            c.near.Load().size(),
	}
	c.mu.Lock()
	for _, l := range c.leaders {
		if l != "" {
			out.LeaderTableSize++
		}
	}
	c.mu.Unlock()
	return out
}

// Leaders returns a copy of the leader table: the gRPC address of each group's
// leader as last learned ("" = unknown).
func (c *Client) Leaders() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.leaders)
}

// bearerToken sends "authorization: Bearer <token>" with every call. It
// does not require TLS: the development default is plaintext on loopback;
// on a network, serve TLS so the token does not travel in the clear.
type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return false }
