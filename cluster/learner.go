package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// Every server enters a group as a non-voter (a learner) and is promoted only
// once its log is within LearnerMaxLag entries of the leader's, read from the
// server itself. So a server that does not answer, answers at another
// address, or cannot keep up never counts towards the group's quorum: the
// voters, and what a commit needs, stay as they were until the new server
// can take part. The operator's add-voter, automatic placement and node
// replacement all go through AddLearner.
const (
	// LearnerMaxLag: how far (raft entries) a learner's log may trail the
	// leader's last index to be promoted. A caught-up follower under load
	// trails by the few entries in flight; 256 is one MaxAppendEntries
	// batch, i.e. a single AppendEntries away.
	LearnerMaxLag = 256
	// defaultCatchUp bounds the wait for a learner to catch up when the
	// caller does not say; a fresh server receives a snapshot first.
	defaultCatchUp = 20 * time.Second
	// autoCatchUp bounds it for automatic placement, which has no caller
	// waiting and retries at the next reconcile anyway.
	autoCatchUp = 2 * time.Minute
	// probeTimeout bounds the check that the address answers raft at all.
	probeTimeout = 3 * time.Second
	// learnerPoll is how often the leader asks the learner for its progress.
	learnerPoll = 200 * time.Millisecond
	// learnerResume is how often a leader looks for learners a previous
	// leader left unpromoted (controller.go, resumeLearners).
	learnerResume = 2 * time.Second
)

// LearnerRequest is one server to add to a group led here.
type LearnerRequest struct {
	Group   int
	ID      string
	Addr    string        // raft address; "" = the member's gossiped one
	Force   bool          // allow a second voter in a zone
	CatchUp time.Duration // bound of the catch-up wait; 0 = defaultCatchUp
	Reason  string        // logged
}

// LearnerResult says what AddLearner did.
type LearnerResult struct {
	Index        uint64        // configuration index after the promotion
	CatchUp      time.Duration // time spent as a non-voter
	Lag          uint64        // entries behind the leader when promoted
	AlreadyVoter bool          // nothing to do
}

// AddLearner adds req.ID to group req.Group (led here) as a non-voter, waits
// until it has caught up and promotes it. Errors are gRPC statuses naming the
// reason; a refusal before the first change leaves the configuration as it
// was, and a learner that does not catch up in time is removed again.
func (c *Controller) AddLearner(ctx context.Context, req LearnerRequest) (LearnerResult, error) {
	g := req.Group
	r := c.node.Raft(g)
	if r.State() != raft.Leader {
		return LearnerResult{}, status.Errorf(codes.Unavailable, "group %d: this node no longer leads the group; retry", g)
	}
	if req.ID == "" {
		return LearnerResult{}, status.Error(codes.InvalidArgument, "add-voter: server id is required")
	}
	if !c.learners.claim(g, req.ID) {
		return LearnerResult{}, status.Errorf(codes.Aborted, "add-voter: group %d: an addition of %q is already in progress on this leader; retry when it has ended", g, req.ID)
	}
	defer c.learners.release(g, req.ID)
	if req.Addr != "" {
		// The reason an operator most needs first: nothing answers there.
		if err := c.node.ProbeRaft(g, raft.ServerAddress(req.Addr), probeTimeout); err != nil {
			return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
				"add-voter: group %d: %q at %s does not answer raft: %v; nothing was changed", g, req.ID, req.Addr, err)
		}
	}
	members := c.node.Members()
	var target *membership.Member
	for i, m := range members {
		if m.ID == req.ID {
			target = &members[i]
		}
	}
	if target == nil || target.Status != membership.StatusAlive {
		st := "not a member"
		if target != nil {
			st = "a " + target.Status + " member"
		}
		return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
			"add-voter: %q is %s of the cluster: a server must be running and joined (serf) so its log can be checked before it votes; nothing was changed", req.ID, st)
	}
	addr := req.Addr
	if addr == "" {
		addr = target.RaftAddr
		// Gossip can still show an earlier incarnation of the node for a
		// while after its data dir was replaced (memberlist keeps the
		// older, higher-numbered alive state until the node refutes it). A
		// learner added at that address would be refused by the node until
		// the catch-up bound: the node's own word decides.
		self, err := c.peerNodeGroups(ctx, target.GRPCAddr)
		switch {
		case err != nil:
			return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
				"add-voter: %q does not answer at %s (gRPC, gossiped): %v; nothing was changed", req.ID, target.GRPCAddr, status.Convert(err).Message())
		case self.NodeId != req.ID:
			return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
				"add-voter: %s (gossiped gRPC address of %q) is node %q; nothing was changed", target.GRPCAddr, req.ID, self.NodeId)
		case self.RaftAddr != "" && self.RaftAddr != addr:
			c.log.Info("gossip lists an earlier raft address; using the node's own", "group", g, "node", req.ID, "gossiped", addr, "reported", self.RaftAddr)
			addr = self.RaftAddr
		}
	}
	if req.Addr != "" && addr != target.RaftAddr {
		return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
			"add-voter: %q listens for raft at %s (gossiped), not %s; nothing was changed (omit --address to use the gossiped one)", req.ID, target.RaftAddr, addr)
	}
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return LearnerResult{}, c.cfg.RaftError(g, "read configuration", err)
	}
	conf := fut.Configuration()
	var existing *raft.Server
	for i, srv := range conf.Servers {
		if string(srv.ID) == req.ID {
			existing = &conf.Servers[i]
		}
	}
	if existing != nil && existing.Suffrage == raft.Voter && string(existing.Address) == addr {
		return LearnerResult{Index: fut.Index(), AlreadyVoter: true}, nil
	}
	if !req.Force {
		if err := zoneConflict(g, conf, members, target); err != nil {
			return LearnerResult{}, err
		}
	}
	if req.Addr == "" { // an explicit address was probed first thing
		if err := c.node.ProbeRaft(g, raft.ServerAddress(addr), probeTimeout); err != nil {
			return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
				"add-voter: group %d: %q at %s does not answer raft: %v; nothing was changed", g, req.ID, addr, err)
		}
	}
	if existing != nil && existing.Suffrage == raft.Voter {
		// A voter that moved: raft keeps its suffrage when the address
		// changes, so there is no learner step; the probe above and the
		// gossiped address vouch for the new one.
		c.log.Info("updating voter address", "group", g, "node", req.ID, "from", existing.Address, "to", addr, "reason", req.Reason)
		af := r.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(addr), 0, MembershipTimeout)
		if err := af.Error(); err != nil {
			return LearnerResult{}, c.cfg.RaftError(g, "update voter address", err)
		}
		return LearnerResult{Index: af.Index()}, nil
	}

	start := time.Now()
	addIndex := fut.Index()
	if existing == nil || string(existing.Address) != addr {
		c.log.Info("adding server as non-voter", "group", g, "node", req.ID, "raft", addr, "reason", req.Reason)
		nf := r.AddNonvoter(raft.ServerID(req.ID), raft.ServerAddress(addr), 0, MembershipTimeout)
		if err := nf.Error(); err != nil {
			return LearnerResult{}, c.cfg.RaftError(g, "add non-voter", err)
		}
		addIndex = nf.Index()
	}
	bound := req.CatchUp
	if bound <= 0 {
		bound = defaultCatchUp
	}
	if dl, ok := ctx.Deadline(); ok {
		// Leave the caller time to hear why, and the removal time to run.
		bound = min(bound, time.Until(dl)-MembershipTimeout/2)
	}
	lag, err := c.waitCaughtUp(ctx, g, target.GRPCAddr, req.ID, addIndex, bound)
	if err != nil {
		if r.State() != raft.Leader {
			return LearnerResult{}, status.Errorf(codes.Unavailable,
				"group %d: leadership moved while %q was catching up as a non-voter (%v); retry: the new leader continues from there", g, req.ID, err)
		}
		// Removed even when an earlier, interrupted attempt added it: a
		// non-voter that cannot keep up serves no purpose.
		undo := "it was removed again"
		if rerr := r.RemoveServer(raft.ServerID(req.ID), 0, MembershipTimeout).Error(); rerr != nil {
			undo = fmt.Sprintf("removing it again failed (%v): it is left a non-voter, which counts for no quorum", rerr)
		}
		c.log.Warn("non-voter did not catch up; not promoted", "group", g, "node", req.ID, "err", err, "undo", undo)
		return LearnerResult{}, status.Errorf(codes.FailedPrecondition,
			"add-voter: group %d: %q was added as a non-voter but did not catch up within %v: %v; %s; the voters are unchanged",
			g, req.ID, bound.Round(time.Millisecond), err, undo)
	}
	took := time.Since(start)
	af := r.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(addr), 0, MembershipTimeout)
	if err := af.Error(); err != nil {
		return LearnerResult{}, c.cfg.RaftError(g, "promote non-voter", err)
	}
	c.log.Info("non-voter caught up; promoted to voter", "group", g, "node", req.ID, "catch_up", took.Round(time.Millisecond), "lag_entries", lag)
	return LearnerResult{Index: af.Index(), CatchUp: took, Lag: lag}, nil
}

// zoneConflict refuses a second voter in a zone that already has one: losing
// that zone would then cost two votes.
func zoneConflict(g int, conf raft.Configuration, members []membership.Member, target *membership.Member) error {
	zoneOf := map[string]string{}
	for _, m := range members {
		zoneOf[m.ID] = m.Zone
	}
	for _, srv := range conf.Servers {
		if srv.Suffrage != raft.Voter || string(srv.ID) == target.ID {
			continue
		}
		if z, ok := zoneOf[string(srv.ID)]; ok && z == target.Zone {
			return status.Errorf(codes.FailedPrecondition,
				"add-voter: group %d already has voter %s in zone %s; a second voter there means losing that zone costs two votes (--force to add %s anyway); nothing was changed",
				g, srv.ID, z, target.ID)
		}
	}
	return nil
}

// errCatchUp describes the learner's progress when the wait ends.
var errCatchUp = errors.New("not caught up")

// waitCaughtUp polls the learner's own view of group g until its replica
// follows this node in the current term, holds the configuration entry that
// added it (addIndex: the proof that this leader reaches it at the address in
// the configuration) and trails the leader's last index by at most
// LearnerMaxLag. It returns the lag, or an error with the last thing learned.
func (c *Controller) waitCaughtUp(ctx context.Context, g int, grpcAddr, id string, addIndex uint64, bound time.Duration) (uint64, error) {
	r := c.node.Raft(g)
	deadline := time.Now().Add(bound)
	last := "no answer yet"
	t := time.NewTicker(learnerPoll)
	defer t.Stop()
	for {
		if r.State() != raft.Leader {
			return 0, fmt.Errorf("%w: this node lost leadership (%s)", errCatchUp, last)
		}
		gs, err := c.learnerState(ctx, grpcAddr, g)
		switch {
		case err != nil:
			last = fmt.Sprintf("its node at %s did not answer: %v", grpcAddr, status.Convert(err).Message())
		case gs.RaftState == raft.Shutdown.String():
			// Terminal: a raft replica that was shut down never runs again
			// in that process, so waiting out the bound (autoCatchUp is
			// minutes) would only hold the (group, server) claim, and
			// keep the operator's own add-voter of it Aborted, for nothing.
			return 0, fmt.Errorf("%w: its replica of the group is shut down (it runs again only when its node restarts)", errCatchUp)
		case gs.LeaderId != c.cfg.NodeID:
			last = fmt.Sprintf("its replica is %s and follows %q, not this leader", gs.RaftState, gs.LeaderId)
		case gs.LastIndex < addIndex:
			last = fmt.Sprintf("its log ends at %d, before the entry that added it (%d)", gs.LastIndex, addIndex)
		default:
			leaderLast := r.LastIndex()
			lag := uint64(0)
			if leaderLast > gs.LastIndex {
				lag = leaderLast - gs.LastIndex
			}
			if lag <= LearnerMaxLag {
				return lag, nil
			}
			last = fmt.Sprintf("its log ends at %d, %d entries behind the leader's %d (at most %d to be promoted)", gs.LastIndex, lag, leaderLast, LearnerMaxLag)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%w: %s", errCatchUp, last)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %v (%s)", errCatchUp, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// learnerState asks the node at grpcAddr for its replica of group g.
func (c *Controller) learnerState(ctx context.Context, grpcAddr string, g int) (*api.GroupState, error) {
	ng, err := c.peerNodeGroups(ctx, grpcAddr)
	if err != nil {
		return nil, err
	}
	for _, gs := range ng.Groups {
		if int(gs.Group) == g {
			return gs, nil
		}
	}
	return nil, fmt.Errorf("it reports no group %d", g)
}

// peerNodeGroups asks the node at grpcAddr for its Admin.NodeGroups through
// the port: its id, raft address and replicas.
func (c *Controller) peerNodeGroups(ctx context.Context, grpcAddr string) (*api.NodeGroupsResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.node.PeerGroups(cctx, grpcAddr)
}

// learnerAdds tracks the additions in progress on this leader, at most one
// per (group, server): the operator's and automatic placement's, which runs
// in the background (a catch-up can take minutes and must not stall the
// cluster loop).
type learnerAdds struct {
	mu      sync.Mutex
	running map[learnerKey]bool
}

type learnerKey struct {
	group int
	id    string
}

// claim marks (g, id) in progress; false if it already is.
func (l *learnerAdds) claim(g int, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := learnerKey{g, id}
	if l.running[k] {
		return false
	}
	if l.running == nil {
		l.running = map[learnerKey]bool{}
	}
	l.running[k] = true
	return true
}

func (l *learnerAdds) release(g int, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.running, learnerKey{g, id})
}

// busy reports whether (g, id) is in progress.
func (l *learnerAdds) busy(g int, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running[learnerKey{g, id}]
}

// start runs placement's add in the background unless the same (group,
// server) is already in progress.
func (l *learnerAdds) start(c *Controller, add voterAdd) {
	if l.busy(add.Group, add.Member.ID) {
		return
	}
	c.cfg.WG.Add(1)
	go func() {
		defer c.cfg.WG.Done()
		ctx, cancel := c.untilClosing()
		defer cancel()
		res, err := c.AddLearner(ctx, LearnerRequest{
			Group: add.Group, ID: add.Member.ID, Addr: add.Member.RaftAddr,
			Force:   true, // placement chose the zone; a zone-less cluster places several voters in one
			CatchUp: autoCatchUp, Reason: add.Reason,
		})
		switch {
		case status.Code(err) == codes.Aborted:
			// Already in progress (claimed after the busy check).
		case err != nil:
			c.log.Warn("add voter failed; retried when a member next becomes alive (or, for a learner left unpromoted, by the group's next leader)",
				"group", add.Group, "node", add.Member.ID, "reason", add.Reason, "err", err)
		case !res.AlreadyVoter:
			c.log.Info("voter added", "group", add.Group, "node", add.Member.ID, "reason", add.Reason,
				"catch_up", res.CatchUp.Round(time.Millisecond), "lag_entries", res.Lag)
		}
	}()
}
