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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
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
	// Layout, when set, is the cluster's partition → group table now: each
	// round routes tenants by it (Owner.SetLayout), so a raise's moves
	// carry rate owners to the new groups. nil: the arithmetic.
	Layout func() *layout.Table
	// ClientOf names the caller of a stream for MaxTenantsPerClient (its
	// credential, or its address); nil: every stream is its own client.
	ClientOf func(ctx context.Context) string
	// Peer is this node's connection to another node's gRPC address, for
	// the hand-off of a moved key (handoff.go); nil: no hand-offs are
	// fetched (a moved key is rebuilt from the clients' reports).
	Peer func(addr string) (grpc.ClientConnInterface, error)
	// MaxTenantsPerClient bounds the tenant names one client's open streams
	// on this node introduced, together (default 200,000): each name holds
	// state on the node for the stream's life, so many streams of many
	// names would otherwise spend the node's memory without bound.
	MaxTenantsPerClient int
}

// Service is the RateLimit gRPC service of one node plus its tick loop.
type Service struct {
	api.UnimplementedRateLimitServer
	api.UnimplementedRateAdmitServer
	cfg     ServiceConfig
	o       *Owner
	closing chan struct{}
	// kick asks Run for a round before the period ends: an asker waits in
	// Admit for its report to be folded in (after a takeover), and a
	// report is folded only by a round.
	kick chan struct{}

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

	fetchMu  sync.Mutex
	fetching map[string]chan struct{} // keys whose hand-off is being fetched, closed when done
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
	return &Service{cfg: cfg, o: o, closing: make(chan struct{}), kick: make(chan struct{}, 1), budget: map[string]int{},
		fetching: map[string]chan struct{}{}}, nil
}

// Run ticks the owner every period until ctx ends, then ends every stream
// with Unavailable so clients move to another node.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.o.cfg.Period)
	defer t.Stop()
	defer close(s.closing)
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
			// At most one extra round per kickSpacing: a round walks
			// every tenant.
			if time.Since(last) < kickSpacing(s.o.cfg.Period) {
				continue
			}
		}
		start := time.Now()
		last = start
		s.takeLayout()
		s.o.Tick(s.cfg.Now(), s.cfg.Owns, s.cfg.LeaderOf)
		for from, keys := range s.o.PendingHandoffs() {
			// Only keys no fetch is under way for: a round does not wait
			// for one, nor start a goroutine that would.
			if mine, _, done := s.claim(keys); len(mine) > 0 {
				go s.fetchClaimed(ctx, from, mine, done)
			}
		}
		s.tickNanos.Store(int64(time.Since(start)))
		c := s.o.counts(s.cfg.Now().UnixNano())
		s.owned.Store(int64(c.owned))
		s.blocked.Store(int64(c.blocked))
		s.limited.Store(int64(c.limited))
		s.limitedRate.Store(math.Float64bits(c.limitedRate))
		s.limitedLimit.Store(math.Float64bits(c.limitedLimit))
	}
}

// kickSpacing is the least time between two rounds Admit asks for.
func kickSpacing(period time.Duration) time.Duration { return period / 8 }

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
		// The sender stops on the stream's end: a deadline or a
		// cancellation is the caller's to see as such, not as a clean
		// close (an OK end reached a client with a 2-s deadline as EOF,
		// Unknown, before its own timer: server TestRateSyncScopedToTenants
		// under -race in a fresh-clone run).
		if cerr := stream.Context().Err(); cerr != nil {
			return status.FromContextError(cerr).Err()
		}
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

// Admit serves RateAdmit.Admit (api.RateAdmit_Admit_FullMethodName): the owner decides a
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
	g := s.o.groupOf(key)
	from := Asker{ID: r.ClientId}
	if len(r.BucketConsumed) == 2 {
		from.Known, from.Consumed, from.Cap = true, r.BucketConsumed[0], r.BucketConsumed[1]
	}
	if len(r.PrevBucketConsumed) == 1 {
		from.History = r.PrevBucketConsumed[0]
	}
	res, err := s.o.Admit(key, r.ConsumedTotal[0], s.cfg.Now(), s.cfg.Owns(g), from)
	if pf, pending := s.o.HandoffPending(key); err == nil && res.Unseen && pending {
		// A key a raise moved here: fetch what its previous owner counted
		// (handoff.go) and decide with it. For three periods at most, as
		// the wait below: the asker gives up after a second
		// (ratelease.askTimeout) and then fails open on a key it has no
		// fresh state for, so an ask must be answered, refused if need
		// be, well before that; the round's fetch goes on meanwhile.
		fctx, cancel := context.WithTimeout(ctx, 3*s.o.cfg.Period)
		s.fetchHandoff(fctx, pf, []string{key})
		cancel()
		res, err = s.o.Admit(key, r.ConsumedTotal[0], s.cfg.Now(), s.cfg.Owns(g), from)
	}
	// An asker whose report has not been folded in yet (it reaches the
	// owner within a report period, after a takeover or when the owner
	// recycled the key) waits here for it, up to three periods, rather than
	// being refused: a refusal would reach Envoy as OVER_LIMIT for a request
	// the window has room for.
	for wait := time.Now().Add(3 * s.o.cfg.Period); err == nil && res.Unseen && time.Now().Before(wait); {
		// Its report may be here already, waiting for the next round to
		// be folded in: have that round now rather than up to a period
		// later. The asks held meanwhile would otherwise all be decided
		// at once, bunching the window's slots, and a window that starts
		// just after such a bunch is short of it a whole window later
		// (each slot is taken again only as requests come).
		select {
		case s.kick <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-s.closing:
			return nil, status.Error(codes.Unavailable, "node is shutting down; ask the new owner")
		case <-time.After(res.NextFree):
		}
		res, err = s.o.Admit(key, r.ConsumedTotal[0], s.cfg.Now(), s.cfg.Owns(g), from)
	}
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

// Handoffs counts the moved sliding keys handed over to this node by their
// previous owners, and those whose hand-off did not come in time
// (handoff.go).
func (s *Service) Handoffs() (handed, missed uint64) {
	return s.o.handoffs.Load(), s.o.handoffsMissed.Load()
}

// Owned reports whether this node owns the tenant's rate state now
// (Owner.Owned).
func (s *Service) Owned(name string) bool { return s.o.Owned(name) }

// GroupOf is the raft group owning the tenant's rate state by this node's
// table (the layout's, once SetLayout gave one).
func (s *Service) GroupOf(name string) int { return s.o.groupOf(name) }

// maxHandoffKeys bounds the keys of one Handoff call.
const maxHandoffKeys = 1000

// Handoff serves RateAdmit.Handoff on a key's previous owner (handoff.go):
// once this node's table has moved the keys away (it takes the newest table
// now rather than at its next round), it releases them and answers with
// their state.
func (s *Service) Handoff(ctx context.Context, r *api.RateHandoffRequest) (*api.RateHandoffResponse, error) {
	if len(r.Keys) == 0 || len(r.Keys) > maxHandoffKeys {
		return nil, status.Errorf(codes.InvalidArgument, "handoff: keys: %d, want 1 to %d", len(r.Keys), maxHandoffKeys)
	}
	for i, k := range r.Keys {
		if err := api.ValidateTenantID(k); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "handoff: keys[%d]: %v", i, err)
		}
	}
	select {
	case <-s.closing:
		return nil, status.Error(codes.Unavailable, "node is shutting down")
	default:
	}
	s.takeLayout()
	keys, err := s.o.Release(r.Keys, s.cfg.Now(), s.cfg.Owns)
	if errors.Is(err, ErrStillOwner) {
		return nil, status.Errorf(codes.FailedPrecondition, "handoff: %v; ask again once it has the new table", err)
	}
	if err != nil {
		return nil, err
	}
	out := &api.RateHandoffResponse{Keys: make([]*api.RateHandoffKey, 0, len(keys))}
	for _, k := range keys {
		hk := &api.RateHandoffKey{Key: k.Key, Known: k.Known, AgeNanos: k.Ages, Tokens: k.Tokens}
		for _, c := range k.Clients {
			hk.ClientIds = append(hk.ClientIds, c.ID)
			hk.Consumed = append(hk.Consumed, c.Consumed)
			hk.Cap = append(hk.Cap, c.Cap)
			hk.Asked = append(hk.Asked, c.Asked)
		}
		out.Keys = append(out.Keys, hk)
	}
	return out, nil
}

// fetchHandoff asks group from's leader for keys' hand-off and imports the
// answers, retrying while that node has not taken the new table yet, until
// the keys' wait ends (handoffWait). One fetch per key at a time: a caller
// finding a key being fetched waits for that fetch.
func (s *Service) fetchHandoff(ctx context.Context, from int, keys []string) {
	mine, waits, done := s.claim(keys)
	if len(mine) > 0 {
		s.fetchClaimed(ctx, from, mine, done)
	}
	for _, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// claim marks the keys no fetch is under way for as fetched by the caller
// (mine, closing done when finished: fetchClaimed) and returns the fetches
// under way for the others (waits).
func (s *Service) claim(keys []string) (mine []string, waits []chan struct{}, done chan struct{}) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	done = make(chan struct{})
	for _, k := range keys {
		if ch, ok := s.fetching[k]; ok {
			waits = append(waits, ch)
			continue
		}
		mine = append(mine, k)
		s.fetching[k] = done
	}
	return mine, waits, done
}

// fetchClaimed fetches the keys claim gave the caller, then releases them.
func (s *Service) fetchClaimed(ctx context.Context, from int, mine []string, done chan struct{}) {
	s.fetchKeys(ctx, from, mine)
	s.fetchMu.Lock()
	for _, k := range mine {
		delete(s.fetching, k)
	}
	s.fetchMu.Unlock()
	close(done)
}

// takeLayout routes the owner by the newest layout table (SetLayout), if
// the node has one it has not taken yet.
func (s *Service) takeLayout() {
	if s.cfg.Layout == nil {
		return
	}
	if t := s.cfg.Layout(); t != nil && t != s.o.table.Load() {
		s.o.SetLayout(t, s.cfg.Now())
	}
}

func (s *Service) fetchKeys(ctx context.Context, from int, keys []string) {
	if s.cfg.Owns(from) || s.cfg.Peer == nil {
		// This node led the group the keys moved from: nothing to fetch
		// (or no way to: they are rebuilt from the clients' reports).
		for _, k := range keys {
			s.o.Import(HandoffKey{Key: k}, s.cfg.Now())
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, handoffWait)
	defer cancel()
	for ctx.Err() == nil {
		_, addr := s.cfg.LeaderOf(from)
		var resp *api.RateHandoffResponse
		err := errors.New("no leader known")
		if addr != "" {
			var cc grpc.ClientConnInterface
			if cc, err = s.cfg.Peer(addr); err == nil {
				resp, err = api.NewRateAdmitClient(cc).Handoff(ctx, &api.RateHandoffRequest{Keys: keys})
			}
		}
		if err == nil {
			now := s.cfg.Now()
			for _, hk := range resp.Keys {
				k := HandoffKey{Key: hk.Key, Known: hk.Known, Ages: hk.AgeNanos, Tokens: hk.Tokens}
				n := min(len(hk.ClientIds), len(hk.Consumed), len(hk.Cap), len(hk.Asked))
				for i := range n {
					k.Clients = append(k.Clients, HandedClient{ID: hk.ClientIds[i], Consumed: hk.Consumed[i], Cap: hk.Cap[i], Asked: hk.Asked[i]})
				}
				if s.o.Import(k, now) {
					s.o.handoffs.Add(1)
				}
			}
			return
		}
		s.cfg.Logger.Debug("rate hand-off: asking the previous owner again", "group", from, "keys", len(keys), "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(askMargin(s.o.cfg.Period) * 2):
		}
	}
}
