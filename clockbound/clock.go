package clockbound

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/groupclock"
	"github.com/tollgate-io/tollgate/membership"
)

// Config is what a Clock is built from.
type Config struct {
	NodeID string
	// Groups is the number of groups at start; AddGroup adds more.
	Groups int
	// Bound is the cluster's maximum clock offset (--max-clock-offset).
	Bound time.Duration
	// BootstrapExpect is --bootstrap-expect: before any configuration is
	// known, at least this many voters' clocks count.
	BootstrapExpect int
	// Clock is the node's wall clock (time.Now unless a test injects one).
	Clock      func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Node       Node
}

// Clock is this node's clock bookkeeping: the samples of its peers' clocks,
// whether its own is confirmed, and one groupclock.Clock per group.
type Clock struct {
	cfg   Config
	node  Node
	log   *slog.Logger
	bound time.Duration
	// groups is the published list of group clocks, in group order
	// (list()[g] is group g's). AddGroup swaps in a longer copy and never
	// changes a published one, so the hot path reads it with one atomic
	// load and no lock, and a group's clock stays the same object.
	groups atomic.Pointer[[]*groupclock.Clock]
	addMu  sync.Mutex // serializes AddGroup

	boot string // this process's boot id (BootHeader)
	// attached is set once raft has started (raft's goroutines call the
	// gate before the node's raft host is assigned): until then this node
	// stays "not confirmed" and the node's Raft is not called.
	attached atomic.Bool

	// ok mirrors reason == "" for readers on hot paths (raft's vote gate,
	// leads, every group-time stamp).
	ok atomic.Bool

	mu      sync.Mutex
	peers   map[string]*peerClock
	median  time.Duration // this node minus the median clock
	inBound bool          // confirmed: may lead (reason == "")
	reason  string        // why this node may not lead ("" when it may)
	voters  int           // the most voters of any group, when last computed
	agree   int           // clocks within bound of this one (its own included)

	lastTransfer map[int]time.Time // enforce loop only

	mPeer    *prometheus.GaugeVec
	mMedian  prometheus.Gauge
	mBound   prometheus.Gauge
	mInBound prometheus.Gauge
}

// New builds the clock of a node, not confirmed, and registers its metrics.
// It probes nothing until Run.
func New(cfg Config) (*Clock, error) {
	switch {
	case cfg.NodeID == "":
		return nil, errors.New("clockbound: Config.NodeID is empty")
	case cfg.Groups < 1:
		return nil, fmt.Errorf("clockbound: Config.Groups is %d, want at least 1", cfg.Groups)
	case cfg.Bound <= 0:
		return nil, fmt.Errorf("clockbound: Config.Bound is %s, want > 0", cfg.Bound)
	case cfg.Clock == nil:
		return nil, errors.New("clockbound: Config.Clock is nil")
	case cfg.Logger == nil:
		return nil, errors.New("clockbound: Config.Logger is nil")
	case cfg.Registerer == nil:
		return nil, errors.New("clockbound: Config.Registerer is nil")
	case cfg.Node == nil:
		return nil, errors.New("clockbound: Config.Node is nil")
	}
	c := &Clock{cfg: cfg, node: cfg.Node, log: cfg.Logger, bound: cfg.Bound, peers: map[string]*peerClock{},
		reason:       "clock not confirmed yet: no peer's clock measured since this node started",
		boot:         newBootID(),
		lastTransfer: map[int]time.Time{}}
	c.mPeer = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tollgate_clock_peer_offset_seconds",
		Help: "This node's clock minus the peer's, RTT-corrected (smallest round trip of the recent samples)."}, []string{"peer"})
	c.mMedian = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_offset_seconds",
		Help: "This node's clock minus the median of every measured clock in the cluster (its own included)."})
	c.mBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_max_offset_seconds",
		Help: "The cluster's maximum clock offset (--max-clock-offset)."})
	c.mInBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_in_bound",
		Help: "1 when this node's clock is confirmed (within the maximum offset of a majority of the voters' clocks and of the median clock: it may lead), else 0."})
	c.mBound.Set(c.bound.Seconds())
	c.mInBound.Set(0)
	for _, m := range []prometheus.Collector{c.mPeer, c.mMedian, c.mBound, c.mInBound} {
		if err := cfg.Registerer.Register(m); err != nil {
			return nil, fmt.Errorf("clockbound: register metrics: %w", err)
		}
	}
	groups := make([]*groupclock.Clock, cfg.Groups)
	for g := range groups {
		groups[g] = c.newGroupClock()
	}
	c.groups.Store(&groups)
	return c, nil
}

// newGroupClock builds one group's clock, the same for a group of the start
// and one added later: a group's time must not depend on when this node
// began to serve it.
func (c *Clock) newGroupClock() *groupclock.Clock {
	// Mono is the node's own clock: time.Now's readings carry Go's
	// monotonic clock, so only a clock injected by a test (which has none)
	// makes elapsed time follow that clock's steps.
	return groupclock.New(groupclock.Config{Wall: c.Wall, Mono: c.cfg.Clock, Bound: c.bound, Trusted: c.isTrusted})
}

// list is the current group clocks; a caller keeps using the slice it got
// even if AddGroup publishes a longer one meanwhile.
func (c *Clock) list() []*groupclock.Clock {
	if p := c.groups.Load(); p != nil {
		return *p
	}
	return nil
}

// Groups is the number of groups this clock serves: Config.Groups plus
// those added since.
func (c *Clock) Groups() int { return len(c.list()) }

// AddGroup adds the clock of group g, which must be the next group
// (Groups()); a group already served keeps its clock. It may come before
// the node's raft of g exists: from here the probe loop asks the Node for
// g's raft, and skips g while Node.Raft(g) is nil.
func (c *Clock) AddGroup(g int) error {
	c.addMu.Lock()
	defer c.addMu.Unlock()
	list := c.list()
	if n := len(list); g != n {
		return fmt.Errorf("clockbound: AddGroup: group %d: groups are added in order and the next one here is %d", g, n)
	}
	// Clip: the append must copy, never write into the array readers of
	// the published slice may hold.
	grown := append(slices.Clip(list), c.newGroupClock())
	c.groups.Store(&grown)
	c.log.Info("clockbound: group clock added", "group", g, "groups", len(grown))
	return nil
}

// Group is group g's clock: the time the group stamps on its entries.
func (c *Clock) Group(g int) *groupclock.Clock { return c.list()[g] }

// Attach is called once the node's raft host and membership exist: from
// here the bound is computed from the groups' configurations and the
// members; until then this node asks for no votes.
func (c *Clock) Attach() { c.attached.Store(true) }

// Wall is the node's wall clock corrected by its offset to the cluster's
// median clock.
func (c *Clock) Wall() time.Time {
	c.mu.Lock()
	m := c.median
	c.mu.Unlock()
	return c.cfg.Clock().Add(-m)
}

// isTrusted is read on every stamp (the admission hot path): computed once a
// round by probeAll, never from the member list here.
func (c *Clock) isTrusted() bool { return c.ok.Load() }

// Confirmed reports whether this node's clock is confirmed against a
// majority (it may lead); cached, for hot paths.
func (c *Clock) Confirmed() bool { return c.ok.Load() }

// CampaignGate is raftnode's MayCampaign: nil while this node may lead.
// Recomputed on the spot (elections and transfers are rare): the voters may
// have changed since the last probe round, e.g. the first configuration of a
// cluster being formed.
func (c *Clock) CampaignGate() error {
	if !c.ok.Load() {
		if why := c.OutOfBound(); why != "" {
			return errors.New(why)
		}
	}
	c.refresh()
	if why := c.OutOfBound(); why != "" {
		return errors.New(why)
	}
	return nil
}

// GroupMinute is group g's time as a Unix minute (what admission stamps).
func (c *Clock) GroupMinute(g int) int64 { return c.list()[g].Now() / 60_000 }

// OutOfBound is "" when this node may lead, else why not.
func (c *Clock) OutOfBound() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// MayLeadReason is "" when this node may run leader sessions: its clock is
// confirmed against a majority of the voters' clocks (recomputeLocked). It
// recomputes from the samples held (no probe), so a change of membership or
// configuration counts at once.
func (c *Clock) MayLeadReason() string {
	c.refresh()
	return c.OutOfBound()
}

// PeerReason is why node id may not lead as this node measures it ("" when
// it may, or when it was not measured).
func (c *Clock) PeerReason(id string) string {
	if id == c.cfg.NodeID {
		return c.OutOfBound()
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[id]
	b, ok := p.bestOrNil(now)
	if !ok || !p.fresh(now) {
		return fmt.Sprintf("%s's clock has not been measured since it started", id)
	}
	// The peer's clock minus the median: (me − median) − (me − peer).
	d := c.median - b.offset
	if d > c.bound || d < -c.bound {
		return fmt.Sprintf("%s's clock is %s from the cluster's median clock (max clock offset %s)", id, signed(d), c.bound)
	}
	return ""
}

// voterCount is the most voters any group's configuration has, and the ids
// of every group's voters: whose clocks count. Before any configuration is
// known (a node that has not joined or bootstrapped yet) it is the number of
// members serf knows (not departed) or --bootstrap-expect if larger: never 1
// by default, or a node of a cluster being formed would confirm itself alone
// and could win the first election with any clock.
func (c *Clock) voterCount() (int, map[string]bool) {
	n, ids := 0, map[string]bool{}
	if !c.attached.Load() {
		return max(c.cfg.BootstrapExpect, 1), ids
	}
	for g := range c.Groups() {
		r := c.node.Raft(g)
		if r == nil {
			continue
		}
		fut := r.GetConfiguration() // a copy: does not wait for raft's loop
		if fut.Error() != nil {
			continue
		}
		k := 0
		for _, srv := range fut.Configuration().Servers {
			if srv.Suffrage == raft.Voter {
				k++
				ids[string(srv.ID)] = true
			}
		}
		n = max(n, k)
	}
	if n == 0 {
		known := 0
		for _, m := range c.node.Members() {
			if m.Status != membership.StatusLeft {
				known++
			}
		}
		n = max(known, c.cfg.BootstrapExpect, 1)
	}
	return n, ids
}

// refresh recomputes the bound from the samples held, without probing.
func (c *Clock) refresh() {
	if !c.attached.Load() {
		return // membership and raft not started yet: keep "not confirmed"
	}
	voters, voterIDs := c.voterCount()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recomputeLocked(voters, voterIDs)
}

// recomputeLocked derives the median and whether this node's clock is
// Confirmed, from the voters' fresh samples (voterIDs empty: no
// configuration known, every peer counts). Freshness, not serf's view, says
// whether a peer's clock still counts: only alive members are probed, so a
// peer serf calls failed stops counting within freshAge, and one that
// serf wrongly suspects on a loaded host keeps counting meanwhile (the
// leader does not drop its groups over a gossip hiccup).
func (c *Clock) recomputeLocked(voters int, voterIDs map[string]bool) {
	now := time.Now()
	offs := []time.Duration{0}
	agree := 1
	var far []string
	for id, p := range c.peers {
		if (len(voterIDs) > 0 && !voterIDs[id]) || !p.fresh(now) {
			continue
		}
		b, ok := p.best(now)
		if !ok {
			continue
		}
		offs = append(offs, b.offset)
		if abs(b.offset) <= c.bound {
			agree++
		} else {
			far = append(far, fmt.Sprintf("%s %s", id, signed(-b.offset)))
		}
	}
	slices.Sort(far)
	need := voters/2 + 1
	c.median = medianOf(offs)
	c.voters, c.agree = voters, agree
	switch {
	case abs(c.median) > c.bound:
		c.reason = fmt.Sprintf("clock out of bound: this node's clock is %s from the median of %d measured clocks (max clock offset %s); it does not lead any group until its clock is fixed",
			signed(c.median), len(offs), c.bound)
	case agree < need && len(far) > 0:
		c.reason = fmt.Sprintf("clock not confirmed: only %d of the %d voters' clocks (this one included) are within the max clock offset %s of this node's, a majority (%d) is needed (measured: %s); it does not lead any group until a majority agrees",
			agree, voters, c.bound, need, strings.Join(far, ", "))
	case agree < need:
		c.reason = fmt.Sprintf("clock not confirmed: %d of the %d voters' clocks (this one included) measured since they started, a majority (%d) is needed; it does not lead any group until then",
			agree, voters, need)
	default:
		c.reason = ""
	}
	c.inBound = c.reason == ""
	c.ok.Store(c.inBound)
}
