package cluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

// Removed replicas. A leader that removes a server from its group stops
// replicating to it as soon as the configuration entry is appended (raft's
// rule), so the removed replica never sees the entry: its configuration
// still names it, it hears from no leader, and it pre-votes in vain. On a
// node that keeps running other groups (every replica move leaves one such
// replica behind) the node would count the group as its own — a restart
// would then wait for that replica to load forever, and its cluster view
// would name stale voters.
//
// So a node asks about each group whose replica here names this node but
// knows no leader for staleAfter: the member gossiping that it leads the
// group is asked for its configuration (Node.PeerGroups); if that leader's
// configuration does not name this node, the replica is marked removed
// (Removed) until it hears from a leader again (a leader that re-adds the
// node contacts it).

// staleAfter is how long a replica must know no leader before the node asks;
// staleEvery bounds how often it asks.
const (
	staleAfter = 5 * time.Second
	staleEvery = 5 * time.Second
)

type staleState struct {
	mu         sync.Mutex
	leaderless map[int]time.Time // group → since when its replica here knows no leader
	removed    map[int]bool
	next       time.Time
	busy       bool
}

// Removed reports whether this node's replica of group g was removed from
// the group by its leader although its own configuration still names this
// node (see above). Safe from any goroutine.
func (c *Controller) Removed(g int) bool {
	c.stale.mu.Lock()
	defer c.stale.mu.Unlock()
	return c.stale.removed[g]
}

// checkStale runs from Place: it updates which replicas know no leader and,
// at most every staleEvery, asks the groups' leaders about those that have
// known none for staleAfter, in the background.
func (c *Controller) checkStale(now time.Time, members []membership.Member) {
	st := &c.stale
	var ask []int
	st.mu.Lock()
	if st.leaderless == nil {
		st.leaderless, st.removed = map[int]time.Time{}, map[int]bool{}
	}
	for g := range c.groups() {
		r := c.node.Raft(g)
		if _, id := r.LeaderWithID(); id != "" || r.State() == raft.Leader || r.State() == raft.Shutdown {
			delete(st.leaderless, g)
			delete(st.removed, g)
			continue
		}
		since, ok := st.leaderless[g]
		if !ok {
			st.leaderless[g] = now
			continue
		}
		if now.Sub(since) >= staleAfter && !st.removed[g] {
			ask = append(ask, g)
		}
	}
	if len(ask) == 0 || st.busy || now.Before(st.next) {
		st.mu.Unlock()
		return
	}
	st.busy, st.next = true, now.Add(staleEvery)
	st.mu.Unlock()
	c.cfg.WG.Add(1)
	go func() {
		defer c.cfg.WG.Done()
		defer func() { st.mu.Lock(); st.busy = false; st.mu.Unlock() }()
		ctx, cancel := c.untilClosing()
		defer cancel()
		for _, g := range ask {
			if c.askRemoved(ctx, g, members) {
				st.mu.Lock()
				if _, still := st.leaderless[g]; still {
					st.removed[g] = true
				}
				st.mu.Unlock()
				c.log.Info("this node's replica of the group was removed by its leader (a replica move); it is no longer counted as the node's", "group", g)
			}
		}
	}()
}

// askRemoved asks the member that gossips it leads group g whether its
// configuration names this node; true only when that leader answers as the
// group's leader and its configuration does not.
func (c *Controller) askRemoved(ctx context.Context, g int, members []membership.Member) bool {
	if !c.namesSelf(g) {
		return false
	}
	for _, m := range members {
		if m.ID == c.cfg.NodeID || m.Status != membership.StatusAlive || !slices.Contains(m.GroupsLed, g) || m.GRPCAddr == "" {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.node.PeerGroups(actx, m.GRPCAddr)
		cancel()
		if err != nil {
			continue
		}
		for _, gs := range resp.GetGroups() {
			if int(gs.GetGroup()) != g || gs.GetRaftState() != raft.Leader.String() || len(gs.GetVoters()) == 0 {
				continue
			}
			return !slices.Contains(gs.GetVoters(), c.cfg.NodeID) && !slices.Contains(gs.GetLearners(), c.cfg.NodeID)
		}
	}
	return false
}

// namesSelf reports whether this node's replica of g has a configuration
// naming this node (a replica that names nobody is no member either way).
func (c *Controller) namesSelf(g int) bool {
	fut := c.node.Raft(g).GetConfiguration()
	if fut.Error() != nil {
		return false
	}
	return slices.ContainsFunc(fut.Configuration().Servers, func(s raft.Server) bool { return string(s.ID) == c.cfg.NodeID })
}
