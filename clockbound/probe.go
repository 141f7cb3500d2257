package clockbound

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// Run probes peers and enforces the bound until stop is closed (the node
// begins to stop). Call Attach first.
func (c *Clock) Run(stop <-chan struct{}) {
	for {
		started := time.Now()
		c.probeAll()
		c.enforce()
		wait := probeEvery
		if !c.Confirmed() {
			wait = probeUnconfirmed
		}
		t := time.NewTimer(max(0, wait-time.Since(started)))
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (c *Clock) probeAll() {
	var others []struct{ id, addr string }
	for _, m := range alive(c.node.Members()) {
		if m.ID != c.cfg.NodeID && m.GRPCAddr != "" {
			others = append(others, struct{ id, addr string }{m.ID, m.GRPCAddr})
		}
	}
	var wg sync.WaitGroup
	for _, o := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.probe(o.id, o.addr)
		}()
	}
	wg.Wait()
	voters, voterIDs := c.voterCount()
	c.mu.Lock()
	defer c.mu.Unlock()
	wasWhy := c.reason
	c.recomputeLocked(voters, voterIDs)
	if reasonKind(wasWhy) != reasonKind(c.reason) {
		if c.inBound {
			c.log.Info("clock confirmed: within bound of a majority of the voters' clocks; this node may lead", "median_offset", c.median,
				"agree", c.agree, "voters", c.voters, "max_clock_offset", c.bound)
		} else {
			c.log.Error("this node will not lead any group", "reason", c.reason, "median_offset", c.median, "max_clock_offset", c.bound)
		}
	}
	c.mMedian.Set(c.median.Seconds())
	if c.inBound {
		c.mInBound.Set(1)
	} else {
		c.mInBound.Set(0)
	}
	c.mPeer.Reset()
	now := time.Now()
	for id, p := range c.peers {
		if b, ok := p.best(now); ok {
			c.mPeer.WithLabelValues(id).Set(b.offset.Seconds())
		}
	}
}

// probe takes one sample of the peer's clock: the local wall clock at the
// midpoint of the round trip minus the peer's answer.
func (c *Clock) probe(id, addr string) {
	var errText, boot string
	var smp sample
	cc, err := c.node.Conn(addr)
	if errors.Is(err, ErrNotReady) {
		return
	}
	// A short burst per round, keeping the smallest round trip: a sample's
	// error is at most half its round trip, and a loaded machine stretches
	// some of them.
	for i := range probeBurst {
		if err != nil {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		start := time.Now() // mono: the round trip
		wall0 := c.cfg.Clock()
		var resp *api.ClockNowResponse
		var md metadata.MD
		resp, err = api.NewClockClient(cc).Now(ctx, &api.ClockNowRequest{From: c.cfg.NodeID}, grpc.Header(&md))
		cancel()
		if err == nil {
			if v := md.Get(BootHeader); len(v) > 0 {
				boot = v[0]
			}
			rtt := time.Since(start)
			mid := wall0.Add(rtt / 2)
			if i == 0 || rtt < smp.rtt {
				smp = sample{offset: mid.Sub(time.Unix(0, resp.UnixNano)), rtt: rtt, at: time.Now()}
			}
		}
	}
	if err != nil {
		errText = err.Error()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[id]
	if p == nil || p.addr != addr {
		p = &peerClock{id: id, addr: addr}
		c.peers[id] = p
	}
	p.lastErr, p.probed = errText, true
	if errText != "" {
		return
	}
	if boot != "" && boot != p.boot {
		// The peer restarted (or is first seen): what was measured before
		// says nothing about the clock it runs with now.
		if p.boot != "" {
			c.log.Info("peer restarted: its earlier clock samples no longer count", "peer", id)
		}
		p.samples, p.next, p.boot = p.samples[:0], 0, boot
	}
	p.lastAt = smp.at
	if len(p.samples) < samplesKept {
		p.samples = append(p.samples, smp)
	} else {
		p.samples[p.next] = smp
		p.next = (p.next + 1) % samplesKept
	}
}

// enforce: a node whose clock is not confirmed stops every leader session
// and hands leadership away; confirmed again, a group raft still lets it
// lead gets its session again.
func (c *Clock) enforce() {
	why := c.MayLeadReason()
	for g := range c.Groups() {
		r := c.node.Raft(g)
		if r == nil {
			continue // no raft of g here (yet): nothing to lead or hand away
		}
		if why == "" {
			if r.State() == raft.Leader && !c.node.LeaderSession(g) {
				c.node.ResumeLeaderSession(g)
			}
			continue
		}
		if c.node.LeaderSession(g) {
			c.log.Warn("clock out of bound: stopping the leader session", "group", g, "reason", why)
			c.node.StopLeaderSession(g)
		}
		if r.State() != raft.Leader || time.Since(c.lastTransfer[g]) < transferGap || !hasOtherVoter(r, c.cfg.NodeID) {
			continue
		}
		c.lastTransfer[g] = time.Now()
		to := c.inBoundVoter(r)
		c.log.Warn("clock out of bound: transferring leadership", "group", g, "to", to.ID, "reason", why)
		c.node.Go(func() {
			// To a voter measured within bound: raft's own pick (the most
			// up-to-date voter) may be another node out of bound, and two
			// such nodes would pass the group back and forth.
			var fut raft.Future
			if to.ID != "" {
				fut = r.LeadershipTransferToServer(to.ID, to.Address)
			} else {
				fut = r.LeadershipTransfer()
			}
			if err := fut.Error(); err != nil {
				c.log.Warn("leadership transfer away from an out-of-bound clock failed; retrying", "group", g, "err", err)
			}
		})
	}
}

// inBoundVoter is a voter of r other than this node whose clock this node
// measured within bound (zero when there is none).
func (c *Clock) inBoundVoter(r Raft) raft.Server {
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return raft.Server{}
	}
	for _, srv := range fut.Configuration().Servers {
		id := string(srv.ID)
		if srv.Suffrage != raft.Voter || id == c.cfg.NodeID {
			continue
		}
		if c.PeerReason(id) == "" { // measured since it started, within bound
			return srv
		}
	}
	return raft.Server{}
}

// OffsetFromMedian is node id's clock minus the median clock, as this node
// measures it (false: not measured).
func (c *Clock) OffsetFromMedian(id string) (time.Duration, bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == c.cfg.NodeID {
		return c.median, true
	}
	b, ok := c.peers[id].bestOrNil(now)
	if !ok {
		return 0, false
	}
	return c.median - b.offset, true
}

// hasOtherVoter reports whether r's configuration has a voter other than
// self: someone to hand leadership to.
func hasOtherVoter(r Raft, self string) bool {
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return false
	}
	for _, srv := range fut.Configuration().Servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != self {
			return true
		}
	}
	return false
}

// alive is the members serf reports alive: the ones probed.
func alive(ms []membership.Member) []membership.Member {
	var out []membership.Member
	for _, m := range ms {
		if m.Status == membership.StatusAlive {
			out = append(out, m)
		}
	}
	return out
}
