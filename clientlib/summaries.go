package clientlib

import (
	"context"
	"hash/maphash"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// The near-limit lists come from WatchSummaries streams (api/summaries.proto):
// each group is watched on one node, a follower of the group when one is alive
// (the client's own pseudo-random order of nodes picks which, so a client
// needs few streams and clients spread over the followers), its leader only when
// no follower is usable. Each stream mirrors what its node sent per group
// (summaryMirror) and installs a group into the shared nearTable unless the
// table holds a fresher state of that group (a higher applied index). A node
// answering Unimplemented (an older server) sends the client back to polling
// GetUsersCloseToLimit for watchReprobe, then it tries the stream again.

const (
	// summaryReassign is how often the client re-plans which node watches
	// which group (view changes, nodes coming back).
	summaryReassign = 100 * time.Millisecond
	// summaryGroupRetry is how long a node that said it cannot serve a group
	// (no replica, no contact with its leader) is not asked for it again.
	summaryGroupRetry = 5 * time.Second
)

// summaryStream is one WatchSummaries stream, owned by streamSummaries.
type summaryStream struct {
	addr     string
	groups   []int
	cancel   context.CancelFunc
	stopping bool // canceled by the client (re-planned), not broken
}

// summaryEvent reports from a stream goroutine to streamSummaries.
type summaryEvent struct {
	stream      *summaryStream
	end         bool
	err         error // why the stream ended
	got         bool  // the stream delivered at least one update
	unavailable []int // groups its node said it cannot serve
}

// summaryMirror is what one stream's node sent, per group.
type summaryMirror map[int]*mirrorGroup

type mirrorGroup struct {
	index   uint64
	tenants map[string]struct{}
}

// nearLoop feeds the near-limit table: streams while the servers implement
// WatchSummaries, polls while they do not.
func (c *Client) nearLoop() {
	select {
	case <-c.layoutKnown:
	case <-c.ctx.Done():
		return
	}
	if _, _, err := c.layout(c.ctx); err != nil {
		return
	}
	logged := false
	for c.ctx.Err() == nil {
		addr := c.streamSummaries()
		if c.ctx.Err() != nil {
			return
		}
		if !logged {
			logged = true
			c.log.Warn("clientlib: node does not implement WatchSummaries (older server); polling GetUsersCloseToLimit instead",
				"addr", addr, "every", c.cfg.NearLimitRefresh, "reprobe", c.cfg.watchReprobe)
		}
		c.summaryPolling.Store(true)
		c.pollFor(c.cfg.watchReprobe)
		c.summaryPolling.Store(false)
	}
}

// pollFor polls every NearLimitRefresh for d (or until Close).
func (c *Client) pollFor(d time.Duration) {
	end := time.NewTimer(d)
	defer end.Stop()
	tick := time.NewTicker(c.cfg.NearLimitRefresh)
	defer tick.Stop()
	for {
		c.pollOnce(c.nearGroups())
		select {
		case <-tick.C:
		case <-end.C:
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// streamSummaries keeps every group watched on some node until Close, or
// until a node answers Unimplemented: then it returns that node's address.
// The groups a raise adds are watched from the first reassignment after the
// layout table names them.
func (c *Client) streamSummaries() (unimplemented string) {
	events := make(chan summaryEvent)
	active := map[string]*summaryStream{}
	fails := map[string]int{}
	nodeBad := map[string]time.Time{}
	type addrGroup struct {
		addr  string
		group int
	}
	groupBad := map[addrGroup]time.Time{}
	tick := time.NewTicker(summaryReassign)
	defer tick.Stop()
	done := c.ctx.Done()
	stopAll := func() {
		for _, st := range active {
			st.stopping = true
			st.cancel()
		}
	}
	for {
		if unimplemented == "" && c.ctx.Err() == nil {
			now := time.Now()
			want := c.assignSummaries(c.nearGroups(), func(addr string, grp int) bool {
				return now.Before(nodeBad[addr]) || now.Before(groupBad[addrGroup{addr, grp}])
			})
			for addr, st := range active {
				if !st.stopping && !slices.Equal(st.groups, want[addr]) {
					st.stopping = true
					st.cancel()
				}
			}
			for addr, grps := range want {
				if active[addr] == nil {
					ctx, cancel := context.WithCancel(c.ctx)
					st := &summaryStream{addr: addr, groups: grps, cancel: cancel}
					active[addr] = st
					c.stats.summaryOpened.Add(1)
					c.wg.Add(1)
					go func() { defer c.wg.Done(); c.runSummaryStream(ctx, st, events) }()
				}
			}
		} else if len(active) == 0 {
			return unimplemented
		}
		select {
		case ev := <-events:
			st := ev.stream
			if !ev.end {
				for _, grp := range ev.unavailable {
					groupBad[addrGroup{st.addr, grp}] = time.Now().Add(summaryGroupRetry)
				}
				continue
			}
			st.cancel()
			if active[st.addr] == st {
				delete(active, st.addr)
			}
			switch {
			case status.Code(ev.err) == codes.Unimplemented:
				unimplemented = st.addr
				stopAll()
			case st.stopping || c.ctx.Err() != nil:
			default:
				// The node broke the stream (stopping, dropped us as too
				// slow, unreachable): its groups move to other nodes at
				// once, and it is asked again after a backoff.
				if ev.got {
					fails[st.addr] = 0
				}
				fails[st.addr]++
				wait := jitter(min(c.cfg.RetryInitial<<min(fails[st.addr]-1, 20), c.cfg.RetryMax))
				nodeBad[st.addr] = time.Now().Add(wait)
				c.stats.summaryBreaks.Add(1)
				c.log.Info("clientlib: summary stream ended; groups move to other nodes", "addr", st.addr, "err", ev.err, "retry_in", wait)
			}
		case <-tick.C:
		case <-done:
			done = nil
			stopAll()
		}
	}
}

// assignSummaries plans which node watches each group: a live follower of the
// group first (in this client's order of nodes), its leader when no follower is
// usable; bad says which (node, group) pairs to avoid now. The result maps
// node address → ascending groups.
func (c *Client) assignSummaries(groups int, bad func(addr string, group int) bool) map[string][]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	rank := func(a, b string) int {
		ra, rb := maphash.String(c.summarySeed, a), maphash.String(c.summarySeed, b)
		switch {
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return 0
	}
	out := map[string][]int{}
	var cands []string
	for grp := range groups {
		var leader string
		if grp < len(c.leaders) {
			leader = c.leaders[grp]
		}
		cands = cands[:0]
		if grp < len(c.voters) && len(c.voters[grp]) > 0 {
			for _, m := range c.members {
				if m.status == "alive" && m.addr != "" && m.addr != leader && slices.Contains(c.voters[grp], m.id) && !slices.Contains(cands, m.addr) {
					cands = append(cands, m.addr)
				}
			}
		} else {
			// No view of the voters: any known node may hold a replica.
			for _, a := range c.nodes {
				if a != leader && !slices.Contains(cands, a) {
					cands = append(cands, a)
				}
			}
		}
		slices.SortFunc(cands, rank)
		if leader != "" {
			cands = append(cands, leader)
		}
		for _, a := range cands {
			if !bad(a, grp) {
				out[a] = append(out[a], grp)
				break
			}
		}
	}
	return out
}

// runSummaryStream runs one stream until it breaks or is canceled, then
// reports its end (always: streamSummaries waits for it).
func (c *Client) runSummaryStream(ctx context.Context, st *summaryStream, events chan<- summaryEvent) {
	got := false
	err := func() error {
		cc, err := c.conn(st.addr)
		if err != nil {
			return err
		}
		req := &api.WatchSummariesRequest{Groups: make([]uint32, len(st.groups))}
		for i, g := range st.groups {
			req.Groups[i] = uint32(g)
		}
		stream, err := api.NewSummariesClient(cc).WatchSummaries(ctx, req)
		if err != nil {
			return err
		}
		m := summaryMirror{}
		for {
			u, err := stream.Recv()
			if err != nil {
				return err
			}
			if !got {
				got = true
				c.stats.summaryStreams.Add(1)
				defer c.stats.summaryStreams.Add(-1)
				c.log.Debug("clientlib: watching near-limit summaries", "addr", st.addr, "served_by", u.ServedBy, "groups", st.groups)
			}
			if bad := c.applySummary(m, u); len(bad) > 0 {
				select {
				case events <- summaryEvent{stream: st, unavailable: bad}:
				case <-ctx.Done():
				}
			}
		}
	}()
	events <- summaryEvent{stream: st, end: true, err: err, got: got}
}

// applySummary folds one update into the stream's mirror and installs the
// groups it touched; it returns the groups the node said it cannot serve.
func (c *Client) applySummary(m summaryMirror, u *api.SummaryUpdate) (unavailable []int) {
	c.stats.summaryUpdates.Add(1)
	var touched []int
	for _, gs := range u.Groups {
		grp := int(gs.Group)
		mg := m[grp]
		switch {
		case gs.Unavailable != "":
			delete(m, grp)
			unavailable = append(unavailable, grp)
			continue
		case gs.Full:
			mg = &mirrorGroup{tenants: make(map[string]struct{}, len(gs.Added))}
			m[grp] = mg
		case mg == nil:
			// A change before the group's full set: nothing to apply it to.
			continue
		}
		for _, t := range gs.Removed {
			delete(mg.tenants, t)
		}
		for _, t := range gs.Added {
			mg.tenants[t] = struct{}{}
		}
		mg.index = gs.AppliedIndex
		touched = append(touched, grp)
	}
	if len(touched) > 0 {
		c.installSummary(m, touched, u.ServedBy)
	}
	return unavailable
}

// installSummary copies the mirror's groups into the near-limit table, except
// where the table holds a fresh state at a higher applied index (this stream's
// node is behind another one the client heard from).
func (c *Client) installSummary(m summaryMirror, groups []int, from string) {
	c.nearMu.Lock()
	defer c.nearMu.Unlock()
	old := c.near.Load()
	now := time.Now()
	var nt *nearTable
	for _, grp := range groups {
		if grp >= len(old.groups) {
			continue
		}
		mg, cur := m[grp], &old.groups[grp]
		// A stale table entry (nothing heard for staleAfter) yields to any
		// index: an index that went back for good (a restore) must not make
		// the group unusable.
		if cur.known && mg.index < cur.index && now.Sub(cur.at) <= c.staleAfter() {
			c.stats.summaryStale.Add(1)
			continue
		}
		if nt == nil {
			nt = &nearTable{groups: slices.Clone(old.groups)}
		}
		tenants := cur.tenants
		if !maps.Equal(tenants, mg.tenants) {
			tenants = maps.Clone(mg.tenants) // published maps are never written
		}
		nt.groups[grp] = nearGroup{known: true, at: now, index: mg.index, from: from, tenants: tenants}
	}
	if nt != nil {
		c.near.Store(nt)
	}
}
