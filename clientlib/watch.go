package clientlib

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// watchLoop keeps one WatchCluster stream open, to the known nodes in turn.
// Each ClusterView replaces the leader table and the member list. A node that
// answers Unimplemented leaves the client on NotLeader hints alone; the client
// asks again every watchReprobe (rolling upgrades), logging the fallback once.
func (c *Client) watchLoop() {
	backoff := c.cfg.RetryInitial
	loggedUnimplemented := false
	for attempt := 0; c.ctx.Err() == nil; attempt++ {
		addr := c.watchCandidate(attempt)
		if attempt > 0 {
			c.stats.watchReconnects.Add(1)
		}
		gotView, err := c.watchOnce(addr)
		if c.ctx.Err() != nil {
			return
		}
		if !gotView && err != nil {
			c.setWatchErr(err)
		}
		if gotView {
			backoff = c.cfg.RetryInitial
		}
		wait := jitter(backoff)
		if status.Code(err) == codes.Unimplemented {
			if !loggedUnimplemented {
				loggedUnimplemented = true
				c.log.Warn("clientlib: node does not implement WatchCluster; routing by NotLeader hints only",
					"addr", addr, "reprobe", c.cfg.watchReprobe)
			}
			c.layoutFallback()
			wait = c.cfg.watchReprobe
		} else {
			c.layoutFromConfig() // no view from this node: the configured layout, if any, will do
			c.log.Info("clientlib: cluster watch stream ended; reconnecting", "addr", addr, "err", err, "backoff", wait)
			backoff = min(2*backoff, c.cfg.RetryMax)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
	}
}

// watchCandidate returns the node to watch on the attempt-th try: the known
// nodes (seeds first, then members) in turn.
func (c *Client) watchCandidate(attempt int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[attempt%len(c.nodes)]
}

// watchOnce runs one stream until it breaks. gotView reports whether at least
// one view came.
func (c *Client) watchOnce(addr string) (gotView bool, err error) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	tc, err := c.tracker(addr)
	if err != nil {
		return false, err
	}
	stream, err := tc.WatchCluster(ctx, &api.WatchClusterRequest{ConfigDeltas: true})
	if err != nil {
		return false, err
	}
	for {
		v, err := stream.Recv()
		if err != nil {
			return gotView, err
		}
		if !gotView {
			c.log.Debug("clientlib: watching cluster", "addr", addr, "served_by", v.ServedBy)
		}
		if !gotView {
			c.setWatchErr(nil)
		}
		gotView = true
		// Before applyView: views counted in Stats carry their config.
		if err := c.applyRuntimeConfig(v); err != nil {
			// A delta from a version this client does not hold: a new
			// stream starts with the whole config.
			c.log.Warn("clientlib: runtime config delta not applicable; reopening the cluster stream", "addr", addr, "err", err)
			return gotView, err
		}
		c.applyView(v)
	}
}

// applyView checks the layout and replaces the leader table and member list.
func (c *Client) applyView(v *api.ClusterView) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.stats.watchViews.Add(1) // counted once applied (tests wait on it)
	if c.layoutErr != nil {
		return
	}
	p, g := int(v.Partitions), int(v.Groups)
	if p > 0 && g > 0 {
		switch {
		case c.p == 0:
			cp, cg := c.cfg.Partitions, c.cfg.Groups
			if (cp != 0 && cp != p) || (cg != 0 && cg != g) {
				c.failLayoutLocked(&LayoutError{ConfigPartitions: cp, ConfigGroups: cg, ClusterPartitions: p, ClusterGroups: g, ServedBy: v.ServedBy})
				return
			}
			if err := api.ValidateLayout(p, g, 1); err != nil {
				c.failLayoutLocked(status.Errorf(codes.FailedPrecondition, "clientlib: node %q reports an invalid layout: %v", v.ServedBy, err))
				return
			}
			c.setLayoutLocked(p, g)
		case c.p != p || c.g != g:
			c.failLayoutLocked(&LayoutError{ConfigPartitions: c.p, ConfigGroups: c.g, ClusterPartitions: p, ClusterGroups: g, ServedBy: v.ServedBy})
			return
		}
	}

	c.applyTableLocked(v)

	c.members = c.members[:0]
	for _, m := range v.Members {
		c.members = append(c.members, member{id: m.Id, addr: m.GrpcAddress, status: m.Status})
	}
	nodes := slices.Clone(c.cfg.Addrs)
	for _, m := range c.members {
		if m.addr != "" && m.status == "alive" && !slices.Contains(nodes, m.addr) {
			nodes = append(nodes, m.addr)
		}
	}
	if c.g == 0 {
		c.nodes = nodes
		return
	}
	for _, gi := range v.GroupInfo {
		grp := int(gi.Group)
		if grp >= c.table.Load().Groups {
			continue
		}
		c.growGroupsLocked(grp + 1)
		c.setLeaderLocked(grp, gi.LeaderGrpcAddress)
		c.voters[grp] = slices.Clone(gi.Voters)
		if a := gi.LeaderGrpcAddress; a != "" && !slices.Contains(nodes, a) {
			nodes = append(nodes, a)
		}
	}
	c.nodes = nodes
}

// applyTableLocked routes by the view's layout table when it is at least as
// new as the one held: views come from any node, and a node whose replica of
// group 0 lags serves an older table (or none: the arithmetic, epoch 0).
func (c *Client) applyTableLocked(v *api.ClusterView) {
	cur := c.table.Load()
	if cur == nil || (v.Layout == nil && cur.Epoch == 0) {
		return
	}
	t, err := api.ViewTable(v)
	if err != nil {
		c.log.Warn("clientlib: node serves an invalid layout table; keeping the one held", "node", v.ServedBy, "epoch", cur.Epoch, "err", err)
		return
	}
	if t.Epoch >= cur.Epoch {
		// A raised table (docs/online-groups.md) names groups beyond the
		// count the cluster was created with: the per-group state grows.
		c.growGroupsLocked(t.Groups)
		c.table.Store(t)
	}
}

// movedTo is where a Moved answer sends a partition's request: the answer's
// owner (and its leader, when named) when the answering node's table is at
// least as new as the client's and as every table an earlier Moved answer to
// this request named (floor); else the owner by the client's table, unless
// that is older than floor too (-1: stay, back off and ask again). An older
// answer comes from a replica that has not applied the move yet; the watch
// brings newer tables.
func (c *Client) movedTo(partition int, mv *api.Moved, floor uint64) (group int, leader string) {
	t := c.table.Load()
	if mv.LayoutEpoch >= max(t.Epoch, floor) && int(mv.Group) < maxGroups {
		c.mu.Lock()
		c.growGroupsLocked(int(mv.Group) + 1)
		c.mu.Unlock()
		return int(mv.Group), mv.LeaderGrpcAddress
	}
	if t.Epoch >= floor {
		return t.GroupOf(partition), ""
	}
	return -1, ""
}

// layoutFallback takes the default layout for the fields left at 0 when no
// node serves cluster views.
func (c *Client) layoutFallback() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != 0 || c.layoutErr != nil {
		return
	}
	p, g := c.cfg.Partitions, c.cfg.Groups
	if p == 0 {
		p = api.DefaultPartitions
	}
	if g == 0 {
		g = min(api.DefaultGroups, p)
	}
	if err := api.ValidateLayout(p, g, 1); err != nil {
		c.failLayoutLocked(status.Errorf(codes.FailedPrecondition, "clientlib: no ClusterView to learn the layout from and the defaults do not fit: %v; set Config.Partitions and Config.Groups", err))
		return
	}
	c.log.Warn("clientlib: layout not served by the cluster; assuming defaults", "partitions", p, "groups", g)
	c.setLayoutLocked(p, g)
}

// jitter draws a wait uniformly from [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// ctxStatusErr converts the context's error to a gRPC status error.
func ctxStatusErr(ctx context.Context) error {
	return status.FromContextError(ctx.Err()).Err()
}

// String describes the client for logs.
func (c *Client) String() string {
	p, g := c.Layout()
	return fmt.Sprintf("clientlib.Client{nodes: %v, partitions: %d, groups: %d}", c.cfg.Addrs, p, g)
}
