package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// Elastic placement. PlaceAll (placement.go) says where every group's voters
// belong given the members; planMoves (plan.go) picks one step towards it
// for the groups a node leads; this file runs those steps. A move adds the
// new node through the learner path (learner.go: non-voter, caught up,
// promoted) and only then removes the old voter, so a group has one voter
// more, never one fewer, while it moves. Each leader runs one move at a time
// and starts the next no sooner than MoveInterval after the last: a move
// ships a snapshot of the group to the new node, and moves from every leader
// at once would take the bandwidth tracking needs.

// moveState is a node's replica-move bookkeeping.
type moveState struct {
	busy atomic.Bool // a move runs (one at a time per node)
	next time.Time   // no new move before (cluster loop only)
}

// moveInput gathers planMoves' snapshot: every member, every group led here
// with its configuration.
func (c *Controller) moveInput() moveInput {
	in := moveInput{Self: c.cfg.NodeID, Groups: c.groups(), Replicas: c.cfg.Replicas, Members: c.node.Members()}
	for _, lc := range c.ledConfigs() {
		in.Led = append(in.Led, GroupConfig{Group: lc.group, Servers: lc.conf.Servers})
	}
	return in
}

// maybeMove starts at most one move when none runs here and the interval
// since the last one has passed; it also refreshes the misplaced gauge.
func (c *Controller) maybeMove(now time.Time) {
	if c.cfg.MoveInterval < 0 || c.cfg.DisableAutoPlace || !c.node.Gossip() {
		return
	}
	in := c.moveInput()
	if c.cfg.Misplaced != nil {
		c.cfg.Misplaced.Set(float64(misplacedReplicas(in)))
	}
	if c.moves.busy.Load() || now.Before(c.moves.next) {
		return
	}
	mv, ok := planMoves(in)
	if !ok {
		return
	}
	c.moves.next = now.Add(c.cfg.MoveInterval)
	if mv.Transfer != nil {
		c.log.Info("handing off leadership to move this node's replica", "group", mv.Group, "to", mv.Transfer.ID, "reason", mv.Reason)
		c.moved("handoff")
		c.MoveLeader(LeaderMove{Group: mv.Group, To: *mv.Transfer})
		return
	}
	c.moves.busy.Store(true)
	c.cfg.WG.Add(1)
	go func() {
		defer c.cfg.WG.Done()
		defer c.moves.busy.Store(false)
		ctx, cancel := c.untilClosing()
		defer cancel()
		start := time.Now()
		if err := c.runMove(ctx, mv); err != nil {
			c.moved("failed")
			c.log.Warn("replica move failed; placement retries it", "group", mv.Group, "add", mv.Add.ID, "remove", mv.Remove, "reason", mv.Reason, "err", err)
			return
		}
		c.moved("done")
		c.log.Info("replica moved", "group", mv.Group, "add", mv.Add.ID, "remove", mv.Remove, "reason", mv.Reason, "took", time.Since(start).Round(time.Millisecond))
	}()
}

// runMove executes one placementMove on the group led here: the new voter
// first (when there is one), then the removal, each only while this node
// still leads and the configuration still calls for it.
func (c *Controller) runMove(ctx context.Context, mv placementMove) error {
	g := mv.Group
	if mv.Add.ID != "" {
		if _, err := c.AddLearner(ctx, LearnerRequest{
			Group: g, ID: mv.Add.ID, Addr: mv.Add.RaftAddr,
			Force:   true, // the zone keeps its count: the old voter goes next
			CatchUp: autoCatchUp, Reason: mv.Reason,
		}); err != nil {
			return fmt.Errorf("add %s: %w", mv.Add.ID, err)
		}
	}
	r := c.node.Raft(g)
	if r.State() != raft.Leader {
		return errors.New("leadership moved before the old voter was removed; the next leader removes it")
	}
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	voters := 0
	present := false
	for _, srv := range fut.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters++
			present = present || string(srv.ID) == mv.Remove
		}
	}
	if !present {
		return nil // removed already (an earlier attempt, or the operator)
	}
	if voters <= c.cfg.Replicas {
		return fmt.Errorf("not removing %s: the group has %d voters, not more than its %d", mv.Remove, voters, c.cfg.Replicas)
	}
	if err := r.RemoveServer(raft.ServerID(mv.Remove), 0, MembershipTimeout).Error(); err != nil {
		return fmt.Errorf("remove %s: %w", mv.Remove, err)
	}
	return nil
}

// misplacedReplicas counts the voters of the groups led here that placement
// wants on another node.
func misplacedReplicas(in moveInput) int {
	targets := PlaceAll(in.Groups, placementCandidates(in.Members), in.Replicas)
	n := 0
	for _, gc := range in.Led {
		if gc.Group >= len(targets) {
			continue
		}
		for _, srv := range gc.Servers {
			if srv.Suffrage == raft.Voter && !slices.ContainsFunc(targets[gc.Group], func(m membership.Member) bool { return m.ID == string(srv.ID) }) {
				n++
			}
		}
	}
	return n
}

// PlacementStatus fills resp.Placement from the leaders' reports in
// resp.Nodes and the view's members.
func PlacementStatus(resp *api.StatusResponse, groups, replicas int) {
	var ms []membership.Member
	for _, m := range resp.GetView().GetMembers() {
		ms = append(ms, membership.Member{ID: m.Id, Zone: m.Zone, Status: m.Status, Decommissioning: m.Decommissioning})
	}
	targets := PlaceAll(groups, placementCandidates(ms), replicas)
	leaders := map[uint32]*api.GroupState{} // a deposed leader may still say so: the newest term wins
	for _, n := range resp.Nodes {
		for _, gs := range n.Groups {
			if gs.RaftState != raft.Leader.String() || int(gs.Group) >= len(targets) {
				continue
			}
			if cur, ok := leaders[gs.Group]; !ok || gs.Term > cur.Term {
				leaders[gs.Group] = gs
			}
		}
	}
	for g := range uint32(groups) {
		gs, ok := leaders[g]
		if !ok {
			continue
		}
		gp := &api.GroupPlacement{Group: g, Voters: gs.Voters, Learners: gs.Learners}
		for _, m := range targets[g] {
			gp.Target = append(gp.Target, m.ID)
		}
		slices.Sort(gp.Target)
		resp.Placement = append(resp.Placement, gp)
	}
}

// moved counts one move outcome (done, failed, handoff).
func (c *Controller) moved(result string) {
	if c.cfg.Moves != nil {
		c.cfg.Moves.WithLabelValues(result).Inc()
	}
}
