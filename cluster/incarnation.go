package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// A group leader replaces a server's earlier incarnation with the one its
// member now gossips (package server's identity.go explains incarnations):
// remove the earlier incarnation — only while the voters left include a
// quorum that is up to date — add the new one as a non-voter, wait (bounded) until its log is
// within catchUpLag entries of the leader's commit index, then promote it.
// The new incarnation never counts towards a quorum before it holds the log.

const (
	incarnationCheckEvery = time.Second
	// catchUpLag: a replica whose last log index is within this many entries
	// of the leader's commit index is up to date (a few batches under load).
	catchUpLag = 256
	// catchUpTimeout bounds one wait for a new incarnation to catch up; the
	// next check starts another (the non-voter keeps receiving the log).
	catchUpTimeout   = 2 * time.Minute
	peerStateTimeout = 3 * time.Second
)

// incarnationAction is what a leader does about one server of its group's
// configuration, given the member serf lists under the same id.
type incarnationAction int

const (
	incarnationKeep    incarnationAction = iota
	incarnationReplace                   // the server is an earlier incarnation of the member
	incarnationPromote                   // a non-voter at the member's incarnation that should vote
)

// planIncarnation decides for one server srv of a group whose configuration
// has `voters` voters (zoneHasVoter: one in m's zone). m is the alive member
// with srv's id; cid this node's cluster id.
func planIncarnation(srv raft.Server, m membership.Member, cid string, voters, replicas int, zoneHasVoter bool) incarnationAction {
	if m.Incarnation == "" {
		return incarnationKeep // an earlier build: it cannot tell its incarnations apart
	}
	if cid != "" && m.ClusterID != "" && m.ClusterID != cid {
		return incarnationKeep // another cluster's node: never added
	}
	switch {
	case !sameIncarnation(srv, m):
		return incarnationReplace
	case srv.Suffrage == raft.Nonvoter && (!zoneHasVoter || voters < replicas):
		return incarnationPromote
	}
	return incarnationKeep
}

// sameIncarnation reports whether configuration entry srv stands for the data
// dir member m runs on now. A member of an earlier build gossips no
// incarnation: it counts as the same.
func sameIncarnation(srv raft.Server, m membership.Member) bool {
	if m.Incarnation == "" {
		return true
	}
	_, inc := raftnode.SplitIncarnation(string(srv.Address))
	if inc == "" {
		// A plain address from an earlier build means the data dir that build
		// wrote: the member's if it adopted that data dir, else it was wiped.
		return m.IncarnationAdopted
	}
	return inc == m.Incarnation
}

// listedAddr is the address member m should have in the configuration entry
// srv of the same incarnation: its gossiped address, but without the
// incarnation where srv has none (written by an earlier build, and still
// dialed by nodes of that build during a rolling upgrade).
func listedAddr(srv raft.Server, m membership.Member) string {
	if _, inc := raftnode.SplitIncarnation(string(srv.Address)); inc == "" {
		ep, _ := raftnode.SplitIncarnation(m.RaftAddr)
		return ep
	}
	return m.RaftAddr
}

// incarnationAddr completes an address given for node id by hand: the plain
// endpoint of an alive member that gossips an incarnation becomes that
// incarnation's address (the transport refuses plain addresses for data dirs
// created by this build). Any other address is returned as it is.
func (c *Controller) IncarnationAddr(id, addr string) string {
	if !c.node.Gossip() {
		return addr
	}
	for _, m := range alive(c.node.Members()) {
		if m.ID != id || m.Incarnation == "" {
			continue
		}
		if ep, inc := raftnode.SplitIncarnation(m.RaftAddr); inc != "" && ep == addr {
			return m.RaftAddr
		}
	}
	return addr
}

// RunIncarnations runs the leader's side of incarnation replacement until
// the node starts stopping.
func (c *Controller) RunIncarnations() {
	t := time.NewTicker(incarnationCheckEvery)
	defer t.Stop()
	var mu sync.Mutex
	busy := map[string]bool{}
	for {
		select {
		case <-c.cfg.Closing:
			return
		case <-t.C:
		}
		if !c.node.Gossip() || c.cfg.DisableAutoPlace {
			// --disable-auto-place: operators replace incarnations by hand
			// (remove-server, add-voter), as the node's /readyz says.
			continue
		}
		byID := map[string]membership.Member{}
		for _, m := range alive(c.node.Members()) {
			byID[m.ID] = m
		}
		for _, lc := range c.ledConfigs() {
			g, conf := lc.group, lc.conf
			voters := 0
			zones := map[string]bool{}
			for _, srv := range conf.Servers {
				if srv.Suffrage == raft.Voter {
					voters++
					if m, ok := byID[string(srv.ID)]; ok {
						zones[m.Zone] = true
					} else if string(srv.ID) == c.cfg.NodeID {
						zones[c.cfg.Zone] = true
					}
				}
			}
			for _, srv := range conf.Servers {
				m, ok := byID[string(srv.ID)]
				if !ok || m.ID == c.cfg.NodeID {
					continue
				}
				act := planIncarnation(srv, m, c.node.ClusterID(), voters, c.cfg.Replicas, zones[m.Zone])
				if act == incarnationKeep {
					continue
				}
				key := fmt.Sprint(g, "/", m.ID)
				mu.Lock()
				if busy[key] {
					mu.Unlock()
					continue
				}
				// One path at a time per (group, server): a learner addition
				// in progress (learner.go) promotes its own non-voter.
				if !c.learners.claim(g, m.ID) {
					mu.Unlock()
					continue
				}
				busy[key] = true
				mu.Unlock()
				c.cfg.WG.Add(1)
				go func() {
					defer c.cfg.WG.Done()
					defer c.learners.release(g, m.ID)
					defer func() { mu.Lock(); delete(busy, key); mu.Unlock() }()
					if act == incarnationReplace {
						c.replaceIncarnation(g, srv, m, conf)
					} else {
						c.promoteCaughtUp(g, m)
					}
				}()
			}
		}
	}
}

// replaceIncarnation removes srv (an earlier incarnation of m) from group g
// and adds m in its place through the non-voter path.
func (c *Controller) replaceIncarnation(g int, srv raft.Server, m membership.Member, conf raft.Configuration) {
	r := c.node.Raft(g)
	if srv.Suffrage == raft.Voter {
		if ok, why := c.quorumUpToDateWithout(g, srv.ID, conf); !ok {
			c.LogOnce(g, m.ID, "not replacing the earlier incarnation yet: "+why,
				"group", g, "node", m.ID, "listed", string(srv.Address), "new", m.RaftAddr)
			return
		}
	}
	c.log.Warn("replacing an earlier incarnation of a node (its data dir was replaced): removing it, adding the new one as a non-voter, promoting it once caught up",
		"group", g, "node", m.ID, "earlier", string(srv.Address), "new", m.RaftAddr)
	if err := r.RemoveServer(srv.ID, 0, MembershipTimeout).Error(); err != nil {
		c.log.Warn("remove earlier incarnation failed; retrying", "group", g, "node", m.ID, "err", err)
		return
	}
	// The earlier incarnation is out: nothing else would add the new one
	// back (reconcile acts when a member becomes alive), so retry here while
	// this node leads.
	for attempt := 1; ; attempt++ {
		err := r.AddNonvoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, MembershipTimeout).Error()
		if err == nil {
			break
		}
		c.log.Warn("add new incarnation as non-voter failed; retrying", "group", g, "node", m.ID, "attempt", attempt, "err", err)
		if r.State() != raft.Leader {
			return
		}
		select {
		case <-c.cfg.Closing:
			return
		case <-time.After(time.Second):
		}
	}
	if srv.Suffrage == raft.Voter {
		c.promoteCaughtUp(g, m)
	}
}

// promoteCaughtUp waits (bounded) until m's replica of group g is within
// catchUpLag of this leader's commit index, then makes it a voter.
func (c *Controller) promoteCaughtUp(g int, m membership.Member) {
	r := c.node.Raft(g)
	deadline := time.Now().Add(catchUpTimeout)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		if r.State() != raft.Leader {
			return // the next leader takes over (planIncarnation: promote)
		}
		st, err := c.peerGroupState(m, g)
		if err == nil && st.LastIndex+catchUpLag >= r.CommitIndex() && st.AppliedIndex+catchUpLag >= r.CommitIndex() {
			break
		}
		if time.Now().After(deadline) {
			c.log.Warn("new incarnation did not catch up in time; still a non-voter, will retry", "group", g, "node", m.ID,
				"waited", catchUpTimeout, "leader_commit", r.CommitIndex(), "peer", fmtPeerState(st, err))
			return
		}
		select {
		case <-c.cfg.Closing:
			return
		case <-t.C:
		}
	}
	if err := r.AddVoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, MembershipTimeout).Error(); err != nil {
		c.log.Warn("promote new incarnation failed; retrying", "group", g, "node", m.ID, "err", err)
		return
	}
	c.log.Info("new incarnation caught up and promoted to voter", "group", g, "node", m.ID, "address", m.RaftAddr)
}

func fmtPeerState(st *api.GroupState, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("last_index=%d applied_index=%d", st.LastIndex, st.AppliedIndex)
}

// quorumUpToDateWithout reports whether the voters of conf other than
// `without` include a quorum (of themselves) that is up to date: this leader,
// and followers at the incarnation listed that follow it and whose log is
// within catchUpLag of its commit index.
func (c *Controller) quorumUpToDateWithout(g int, without raft.ServerID, conf raft.Configuration) (bool, string) {
	r := c.node.Raft(g)
	commit := r.CommitIndex()
	byID := map[string]membership.Member{}
	for _, m := range alive(c.node.Members()) {
		byID[m.ID] = m
	}
	left, ok := 0, 0
	var behind []string
	for _, srv := range conf.Servers {
		if srv.Suffrage != raft.Voter || srv.ID == without {
			continue
		}
		left++
		if string(srv.ID) == c.cfg.NodeID {
			ok++
			continue
		}
		m, alive := byID[string(srv.ID)]
		_, inc := raftnode.SplitIncarnation(string(srv.Address))
		if !alive || (inc != "" && inc != m.Incarnation) {
			behind = append(behind, string(srv.ID)+" (down or replaced)")
			continue
		}
		st, err := c.peerGroupState(m, g)
		if err != nil || st.LeaderId != c.cfg.NodeID || st.LastIndex+catchUpLag < commit {
			behind = append(behind, fmt.Sprintf("%s (%s)", srv.ID, fmtPeerState(st, err)))
			continue
		}
		ok++
	}
	if need := left/2 + 1; ok < need {
		return false, fmt.Sprintf("it would leave %d of %d voters up to date, %d needed; behind: %v (leader commit index %d)", ok, left, need, behind, commit)
	}
	return true, ""
}

// peerGroupState asks member m for its replica of group g (admin NodeGroups,
// through the port).
func (c *Controller) peerGroupState(m membership.Member, g int) (*api.GroupState, error) {
	if m.GRPCAddr == "" {
		return nil, fmt.Errorf("%s: no gRPC address", m.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerStateTimeout)
	defer cancel()
	resp, err := c.node.PeerGroups(ctx, m.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: NodeGroups: %w", m.ID, err)
	}
	for _, gs := range resp.Groups {
		if int(gs.Group) == g {
			return gs, nil
		}
	}
	return nil, fmt.Errorf("%s: no state for group %d", m.ID, g)
}

// LogOnce logs a waiting replacement (or another repeating warning about
// a member) at most every 30 s per (group, node): the checks repeat every
// second. Any goroutine.
func (c *Controller) LogOnce(g int, id, msg string, args ...any) {
	key := fmt.Sprint(g, "/", id)
	c.logMu.Lock()
	if c.incLogged == nil {
		c.incLogged = map[string]time.Time{}
	}
	last := c.incLogged[key]
	if time.Since(last) < 30*time.Second {
		c.logMu.Unlock()
		return
	}
	c.incLogged[key] = time.Now()
	c.logMu.Unlock()
	c.log.Warn(msg, args...)
}
