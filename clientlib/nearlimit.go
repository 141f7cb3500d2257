package clientlib

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// nearTable is an immutable snapshot of the near-limit tenants per group.
// Writers (summary streams or the fallback poller, and rejections seen on
// answers) copy and replace it.
type nearTable struct {
	groups []nearGroup
}

type nearGroup struct {
	known   bool      // a summary or poll of this group came at least once
	at      time.Time // last summary (or successful poll) installed
	index   uint64    // the group's applied index that summary was computed at
	from    string    // node id that served the summary ("" for polls, rejections)
	tenants map[string]struct{}
}

func newNearTable(g int) *nearTable { return &nearTable{groups: make([]nearGroup, g)} }

// nearGroups grows the near-limit table to the groups the layout table
// names (a raise adds groups to a running cluster) and returns its size:
// the groups the summary streams and polls cover. A group the table does not
// cover yet is tracked sync (isSync).
func (c *Client) nearGroups() int {
	n := 0
	if t := c.table.Load(); t != nil {
		n = t.Groups
	}
	if old := c.near.Load(); n <= len(old.groups) {
		return len(old.groups)
	}
	c.nearMu.Lock()
	defer c.nearMu.Unlock()
	old := c.near.Load()
	if n <= len(old.groups) {
		return len(old.groups)
	}
	c.near.Store(&nearTable{groups: append(slices.Clone(old.groups), make([]nearGroup, n-len(old.groups))...)})
	return n
}

func (t *nearTable) size() int {
	n := 0
	for _, g := range t.groups {
		n += len(g.tenants)
	}
	return n
}

// staleAfter is how old a group's near-limit list may get (polls failing)
// before the client stops trusting it and tracks that group sync.
func (c *Client) staleAfter() time.Duration {
	return 5*c.cfg.NearLimitRefresh + c.cfg.AsyncTimeout
}

// isSync reports whether tenant's requests for group must wait for the
// answer: always in ModeSync; in ModeAuto when the tenant is near its limit
// in the group, or when the client has no fresh near-limit list for it.
func (c *Client) isSync(group int, tenant string) bool {
	if c.cfg.Mode == ModeSync {
		return true
	}
	t := c.near.Load()
	if group >= len(t.groups) {
		return true
	}
	ng := &t.groups[group]
	if !ng.known || time.Since(ng.at) > c.staleAfter() {
		return true
	}
	_, near := ng.tenants[tenant]
	return near
}

// markNear records that tenant is at its limit in group (an answer rejected
// some of its series), until the next successful poll of the group says
// otherwise.
func (c *Client) markNear(group int, tenant string) {
	if c.cfg.Mode == ModeSync {
		return
	}
	if t := c.near.Load(); group < len(t.groups) {
		if _, ok := t.groups[group].tenants[tenant]; ok {
			return
		}
	}
	c.nearMu.Lock()
	defer c.nearMu.Unlock()
	old := c.near.Load()
	if group >= len(old.groups) {
		return
	}
	nt := &nearTable{groups: slices.Clone(old.groups)}
	ng := &nt.groups[group]
	m := make(map[string]struct{}, len(ng.tenants)+1)
	for k := range ng.tenants {
		m[k] = struct{}{}
	}
	m[tenant] = struct{}{}
	ng.tenants = m
	c.near.Store(nt)
}

// pollOnce (the fallback against servers without WatchSummaries) polls every group in parallel and installs the lists that came.
func (c *Client) pollOnce(groups int) {
	type res struct {
		tenants []string
		ok      bool
	}
	results := make([]res, groups)
	var wg sync.WaitGroup
	for grp := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenants, ok := c.pollGroup(grp)
			results[grp] = res{tenants, ok}
		}()
	}
	wg.Wait()
	if c.ctx.Err() != nil {
		return
	}
	now := time.Now()
	c.nearMu.Lock()
	defer c.nearMu.Unlock()
	old := c.near.Load()
	if len(old.groups) < groups { // never shrinks; grown only by nearGroups
		return
	}
	nt := &nearTable{groups: slices.Clone(old.groups)}
	for grp, r := range results {
		if !r.ok {
			continue
		}
		m := make(map[string]struct{}, len(r.tenants))
		for _, t := range r.tenants {
			m[t] = struct{}{}
		}
		// Polls carry no applied index: keep the last one streamed.
		nt.groups[grp] = nearGroup{known: true, at: now, index: old.groups[grp].index, tenants: m}
	}
	c.near.Store(nt)
}

// pollGroup asks up to two candidate nodes for group's near-limit tenants.
func (c *Client) pollGroup(group int) ([]string, bool) {
	t := c.table.Load()
	if t == nil {
		return nil, false
	}
	owned := t.Owned(group)
	if len(owned) == 0 {
		return nil, true // a group that owns no partition holds no tenants
	}
	lo := owned[0]
	for i, addr := range c.pollCandidates(group, 2) {
		c.stats.nearLimitPolls.Add(1)
		tc, err := c.tracker(addr)
		if err != nil {
			return nil, false
		}
		ctx, cancel := context.WithTimeout(c.ctx, max(c.cfg.NearLimitRefresh, time.Second))
		resp, err := tc.GetUsersCloseToLimit(ctx, &api.GetUsersCloseToLimitRequest{Partition: uint32(lo)})
		cancel()
		if err == nil && int(resp.Group) == group {
			return resp.Tenants, true
		}
		c.stats.nearLimitPollErrors.Add(1)
		if c.ctx.Err() != nil {
			return nil, false
		}
		c.log.Debug("clientlib: near-limit poll failed", "group", group, "addr", addr, "try", i+1, "err", err)
	}
	return nil, false
}

// pollCandidates lists up to n nodes to ask about group, best first. Only a
// replica of the group knows its tenants (another node answers an empty
// list), so when the view names the group's voters the candidates are its
// voters that do not lead it (followers serve reads, sparing the leader), then
// its leader; when it does not, the leader, then any known node.
func (c *Client) pollCandidates(group, n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var leader string
	if group < len(c.leaders) {
		leader = c.leaders[group]
	}
	var voters []string
	if group < len(c.voters) {
		voters = c.voters[group]
	}
	var out []string
	add := func(a string) {
		if a != "" && len(out) < n && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	// Rotate the start so followers share the load across polls.
	start := int(c.rr.Add(1))
	if len(voters) > 0 {
		ms := c.members
		for i := range ms {
			m := ms[(start+i)%len(ms)]
			if m.status == "alive" && m.addr != leader && slices.Contains(voters, m.id) {
				add(m.addr)
			}
		}
		add(leader)
		return out
	}
	add(leader)
	for i := range c.nodes {
		add(c.nodes[(start+i)%len(c.nodes)])
	}
	return out
}

// NearLimitView is what a client currently knows of one group's near-limit
// tenants (for tools, tests and debugging; the hot path reads the table
// directly).
type NearLimitView struct {
	Known        bool      // a summary or poll of the group arrived at least once
	At           time.Time // when the last one was installed
	AppliedIndex uint64    // the group's applied index it was computed at (0 for polls)
	From         string    // node id that served it ("" for polls)
	Tenants      []string  // sorted
}

// NearLimit returns the client's view of group's near-limit tenants.
func (c *Client) NearLimit(group int) NearLimitView {
	t := c.near.Load()
	if group < 0 || group >= len(t.groups) {
		return NearLimitView{}
	}
	ng := &t.groups[group]
	v := NearLimitView{Known: ng.known, At: ng.at, AppliedIndex: ng.index, From: ng.from}
	for name := range ng.tenants {
		v.Tenants = append(v.Tenants, name)
	}
	slices.Sort(v.Tenants)
	return v
}
