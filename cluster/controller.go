package cluster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/membership"
)

// MembershipTimeout bounds one raft configuration change.
const MembershipTimeout = 10 * time.Second

// Config is what the controller needs to know about the node and the cluster.
type Config struct {
	NodeID, Zone     string
	Groups, Replicas int
	// RaftGroups is the number of raft groups the node runs now: a raise
	// (docs/online-groups.md) adds groups while it runs (nil: Groups).
	// Placement, reconcile and moves cover them all; forming a new cluster
	// (BootstrapExpect) covers Groups only, as the raise bootstraps its own.
	RaftGroups       func() int
	BootstrapExpect  int  // --bootstrap-expect; 0: this node never bootstraps
	DisableAutoPlace bool // operators place replicas by hand
	// MoveInterval is the least time between two replica moves started
	// here; negative disables moves.
	MoveInterval time.Duration
	// RaftError maps an error of a raft call on group g to a gRPC status
	// (the node's one mapping); nil leaves the error as it is.
	RaftError func(g int, what string, err error) error
	Log       *slog.Logger
	// Misplaced and Moves are the placement metrics (nil: none).
	Misplaced prometheus.Gauge
	Moves     *prometheus.CounterVec
	// Closing is closed when the node starts stopping; background work
	// started by the controller runs in WG, which the node waits for.
	Closing <-chan struct{}
	WG      *sync.WaitGroup
}

// Controller runs a node's cluster duties through the port. Place and
// BalanceLeaders are called by one goroutine (the node's cluster loop);
// RunIncarnations runs in its own; AddLearner, HandOffLeadership and the
// quorum checks may be called from any goroutine.
type Controller struct {
	cfg  Config
	node Node
	log  *slog.Logger

	learners learnerAdds // learner additions in progress while leading (learner.go)
	moves    moveState   // replica moves towards placement (move.go)
	stale    staleState  // replicas removed without knowing it (stale.go)

	// cluster loop only (Place)
	bootstrapped bool
	seenAlive    map[string]bool
	nextLearners time.Time
	strays       map[learnerKey]time.Time // learners placement does not want, since when (resumeLearners)

	logMu     sync.Mutex
	incLogged map[string]time.Time // logIncarnationOnce
}

// New returns the controller of the node behind port.
func New(cfg Config, port Node) *Controller {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.WG == nil {
		cfg.WG = &sync.WaitGroup{}
	}
	if cfg.RaftError == nil {
		cfg.RaftError = func(_ int, _ string, err error) error { return err }
	}
	return &Controller{cfg: cfg, node: port, log: cfg.Log, bootstrapped: cfg.BootstrapExpect == 0, seenAlive: map[string]bool{}, strays: map[learnerKey]time.Time{}}
}

// Bootstrapped reports whether bootstrap has nothing left to do (or never
// had: no --bootstrap-expect).
func (c *Controller) Bootstrapped() bool { return c.bootstrapped }

// Place is the cluster loop's placement step, run on every tick while the
// node gossips: take the cluster id the peers agree on, bootstrap a new
// cluster once --bootstrap-expect members are alive, then, for the groups led
// here, add a member that became alive where placement wants it, or else
// (every learnerResume) finish learners a previous leader left and start at
// most one replica move.
func (c *Controller) Place(now time.Time) {
	if !c.node.Gossip() {
		return
	}
	c.adoptClusterID() // identity.go
	if !c.bootstrapped {
		c.bootstrapped = c.tryBootstrap()
	}
	// Reconcile when a member became alive (joined or came back).
	ms := alive(c.node.Members())
	fresh := false
	aliveNow := map[string]bool{}
	for _, m := range ms {
		aliveNow[m.ID] = true
		if !c.seenAlive[m.ID] {
			fresh = true
		}
	}
	c.seenAlive = aliveNow
	c.checkStale(now, ms) // stale.go
	if fresh && !c.cfg.DisableAutoPlace {
		c.reconcileAll(ms)
	} else if !c.cfg.DisableAutoPlace && now.After(c.nextLearners) {
		c.nextLearners = now.Add(learnerResume)
		c.resumeLearners(now, ms)
		c.maybeMove(now) // move.go
	}
}

func alive(ms []membership.Member) []membership.Member {
	var out []membership.Member
	for _, m := range ms {
		if m.Status == membership.StatusAlive {
			out = append(out, m)
		}
	}
	return out
}

// groups is the number of raft groups the node runs now.
func (c *Controller) groups() int {
	if c.cfg.RaftGroups != nil {
		return c.cfg.RaftGroups()
	}
	return c.cfg.Groups
}

// ledGroups are the groups raft makes this node leader of, ascending.
func (c *Controller) ledGroups() []int {
	var led []int
	for g := range c.groups() {
		if c.node.Raft(g).State() == raft.Leader {
			led = append(led, g)
		}
	}
	return led
}

// untilClosing is a context for background work: cancelled when the node
// starts stopping, or by cancel.
func (c *Controller) untilClosing() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-c.cfg.Closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// tryBootstrap executes planBootstrap: once --bootstrap-expect members are
// alive it bootstraps the groups this node is a voter of. It returns true when
// nothing is left to do.
func (c *Controller) tryBootstrap() bool {
	ms := c.node.Members()
	if len(alive(ms)) < c.cfg.BootstrapExpect {
		return false // not yet; skip reading every group's state
	}
	hasState := make([]bool, c.cfg.Groups)
	for g := range hasState {
		has, err := c.node.GroupHasState(g)
		if err != nil {
			c.log.Error("bootstrap: check group state", "group", g, "err", err)
			return false
		}
		hasState[g] = has
	}
	plan := planBootstrap(bootstrapInput{Self: c.cfg.NodeID, Expect: c.cfg.BootstrapExpect, Replicas: c.cfg.Replicas, Members: ms, HasState: hasState})
	if plan.Wait {
		return false
	}
	// A cluster formed by other members (or by this data dir before it was
	// replaced) is joined, never bootstrapped again (identity.go).
	formed := bootstrapClusterID(aliveByID(ms)[:c.cfg.BootstrapExpect])
	if mine := c.node.ClusterID(); mine != "" && mine != formed {
		c.log.Info("not bootstrapping: this data dir belongs to an existing cluster", "cluster_id", mine)
		return true
	}
	if exists, why := clusterExists(c.cfg.NodeID, ms, formed); exists {
		c.log.Info("not bootstrapping: a cluster exists already; waiting for its leaders to add this node", "why", why)
		return true
	}
	if len(plan.Groups) > 0 && c.node.ClusterID() == "" {
		c.node.SetClusterID(formed, "bootstrapped")
	}
	if len(plan.Ignored) > 0 {
		c.log.Warn("more members alive than --bootstrap-expect; bootstrapping with the first ones by id", "expect", c.cfg.BootstrapExpect, "left_out", plan.Ignored)
	}
	for _, gc := range plan.Groups {
		if err := c.node.BootstrapGroup(gc.Group, gc.Servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			c.log.Error("bootstrap group", "group", gc.Group, "err", err)
			return false
		}
	}
	c.log.Info("bootstrap complete", "expect", c.cfg.BootstrapExpect)
	return true
}

// ledConfig is the configuration of a group this node leads.
type ledConfig struct {
	group int
	conf  raft.Configuration
}

// ledConfigs returns, in group order, the configuration of every group this
// node leads now; a group whose configuration cannot be read (leadership
// just lost) is left out.
func (c *Controller) ledConfigs() []ledConfig {
	var out []ledConfig
	for g := range c.groups() {
		r := c.node.Raft(g)
		if r.State() != raft.Leader {
			continue
		}
		fut := r.GetConfiguration()
		if fut.Error() != nil {
			continue
		}
		out = append(out, ledConfig{group: g, conf: fut.Configuration()})
	}
	return out
}

// reconcileAll executes planReconcile for every group led here, one group at a
// time, so each plan starts from that group's current configuration.
func (c *Controller) reconcileAll(ms []membership.Member) {
	targets := PlaceAll(c.groups(), placementCandidates(ms), c.cfg.Replicas)
	for _, lc := range c.ledConfigs() {
		for _, add := range planReconcile(ms, c.cfg.Replicas, targets[lc.group], GroupConfig{Group: lc.group, Servers: lc.conf.Servers}) {
			c.addVoter(add)
		}
	}
}

// resumeLearners finishes the learner additions a previous leader of a group
// led here started but did not promote (it lost leadership while the server
// caught up): placement's additions of servers that are non-voters now. It
// also re-adds a voter whose raft address changed (a node restarted on new
// ports): that repair is first tried when the member becomes alive again
// (reconcileAll), but the node leading the group then may be another, or
// the attempt may fail, and a voter left at its old address never hears
// from the leader again (its replica waits for one forever). Other
// additions wait for a member to become alive, as in reconcileAll, so a
// server an operator removed stays out. A learner placement no longer wants
// is removed (dropStrays).
func (c *Controller) resumeLearners(now time.Time, ms []membership.Member) {
	var targets [][]membership.Member
	byID := map[string]membership.Member{}
	for _, m := range alive(ms) {
		byID[m.ID] = m
	}
	seen := map[learnerKey]bool{}
	for _, lc := range c.ledConfigs() {
		learners := map[string]bool{}
		moved := false
		for _, srv := range lc.conf.Servers {
			if srv.Suffrage == raft.Nonvoter {
				learners[string(srv.ID)] = true
			} else if m, ok := byID[string(srv.ID)]; ok {
				moved = moved || addrMoved(srv, m)
			}
		}
		if len(learners) == 0 && !moved {
			continue
		}
		if targets == nil {
			targets = PlaceAll(c.groups(), placementCandidates(ms), c.cfg.Replicas)
		}
		for _, add := range planReconcile(ms, c.cfg.Replicas, targets[lc.group], GroupConfig{Group: lc.group, Servers: lc.conf.Servers}) {
			if learners[add.Member.ID] || add.Reason == reasonAddrChanged {
				c.addVoter(add)
			}
		}
		for id := range learners {
			if wanted := slices.ContainsFunc(targets[lc.group], func(m membership.Member) bool { return m.ID == id }); !wanted {
				seen[learnerKey{lc.group, id}] = true
			}
		}
	}
	c.dropStrays(now, seen)
}

// strayAfter is how long a learner must stay unwanted before it is removed:
// longer than a move's add and a leadership change, so a learner some step
// is about to promote is never taken for a stray.
const strayAfter = 10 * time.Second

// dropStrays removes the learners of groups led here that placement has not
// wanted for strayAfter (seen: the unwanted ones now). A move interrupted by
// a leadership change leaves its learner for the new leader to finish; when
// placement has meanwhile chosen another node, nothing would finish it, and
// the group would replicate to it forever and status would show it catching
// up. Nothing runs while this node adds a learner of the group or moves a
// replica.
func (c *Controller) dropStrays(now time.Time, seen map[learnerKey]bool) {
	for k := range c.strays {
		if !seen[k] {
			delete(c.strays, k)
		}
	}
	for k := range seen {
		since, ok := c.strays[k]
		if !ok {
			c.strays[k] = now
			continue
		}
		if now.Sub(since) < strayAfter || c.learners.busy(k.group, k.id) || c.moves.busy.Load() {
			continue
		}
		delete(c.strays, k)
		r := c.node.Raft(k.group)
		if r.State() != raft.Leader {
			continue
		}
		c.cfg.WG.Add(1)
		go func() {
			defer c.cfg.WG.Done()
			if err := r.RemoveServer(raft.ServerID(k.id), 0, MembershipTimeout).Error(); err != nil {
				c.log.Warn("removing a learner placement does not want failed; retrying", "group", k.group, "node", k.id, "err", err)
				return
			}
			c.log.Info("removed a learner placement does not want (a move interrupted by a leadership change left it)", "group", k.group, "node", k.id)
		}()
	}
}

// addVoter executes one voterAdd through the learner path (learner.go), in
// the background; a failure is logged and retried at the next reconcile (when
// a member becomes alive again).
func (c *Controller) addVoter(add voterAdd) {
	c.learners.start(c, add)
}

// BalanceInput gathers PlanBalance's snapshot: alive members with their
// gossiped leader counts, and the configuration of every group led here.
func (c *Controller) BalanceInput() BalanceInput {
	in := BalanceInput{Self: c.cfg.NodeID}
	for _, m := range c.node.Members() {
		// A member whose clock is out of bound may not lead.
		if m.ID == c.cfg.NodeID || c.node.MayLead(m.ID) == "" {
			in.Members = append(in.Members, m)
		}
	}
	for _, g := range c.ledGroups() {
		gc := GroupConfig{Group: g}
		if fut := c.node.Raft(g).GetConfiguration(); fut.Error() == nil {
			gc.Servers = fut.Configuration().Servers
		}
		in.Led = append(in.Led, gc)
	}
	return in
}

// BalanceLeaders executes PlanBalance: at most one leadership transfer.
func (c *Controller) BalanceLeaders() {
	if mv, ok := PlanBalance(c.BalanceInput()); ok {
		c.MoveLeader(mv)
	}
}

// MoveLeader executes one LeaderMove. Raft's transfer is best effort (another
// voter's election may win); the next balance check sees the outcome.
func (c *Controller) MoveLeader(mv LeaderMove) {
	c.log.Info("balancing leadership", "group", mv.Group, "to", mv.To.ID, "led_here", mv.LedHere, "led_there", mv.LedThere)
	if err := c.node.Raft(mv.Group).LeadershipTransferToServer(mv.To.ID, mv.To.Address).Error(); err != nil {
		c.log.Warn("leadership transfer failed", "group", mv.Group, "to", mv.To.ID, "err", err)
	}
}

// HandOffLeadership transfers every group led here to another voter before a
// graceful stop, so clients see a new leader at once instead of after an
// election timeout.
func (c *Controller) HandOffLeadership(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range c.ledGroups() {
		r := c.node.Raft(g)
		fut := r.GetConfiguration()
		if fut.Error() != nil || len(fut.Configuration().Servers) < 2 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- r.LeadershipTransfer().Error() }()
			select {
			case err := <-done:
				if err != nil {
					c.log.Warn("leadership hand-off failed", "group", g, "err", err)
				} else {
					c.log.Info("leadership handed off", "group", g)
				}
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
}
