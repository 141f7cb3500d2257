package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/groupclock"
)

// Clocks. The cluster tolerates node clocks up to MaxClockOffset apart. Every
// node measures its offset to each peer about once a second (Clock.Now over
// gRPC, corrected by half the round trip, the sample with the smallest round
// trip of the last few kept) and compares its own clock with the median of
// all measured clocks, its own included. A node further than the bound from
// that median is out of bound: it does not lead any group (a leader session
// is not started, leadership it holds is handed away, TransferLeadership to
// it is refused) and says so in /readyz, status and metrics; it still serves
// as a follower. Each group's time comes from a groupclock.Clock, fed by the
// entries the group applies and by this node's wall clock corrected by the
// median offset, so no single wrong clock moves a group's time by more than
// the bound.

const (
	clockProbeEvery   = time.Second
	clockProbeTimeout = 2 * time.Second
	clockSamples      = 8                // samples kept per peer (smallest RTT wins)
	clockBurst        = 3                // probes per peer per round (smallest RTT kept)
	clockSampleMaxAge = 30 * time.Second // older samples do not count
	clockTransferGap  = 2 * time.Second  // between leadership hand-offs of one group
)

type clockSample struct {
	offset time.Duration // this node minus the peer
	rtt    time.Duration
	at     time.Time // mono
}

type peerClock struct {
	id, addr string
	samples  []clockSample // ring of the last clockSamples
	next     int
	lastErr  string
	probed   bool // a probe finished (answered or failed)
}

func (p *peerClock) bestOrNil(now time.Time) (clockSample, bool) {
	if p == nil {
		return clockSample{}, false
	}
	return p.best(now)
}

// best is the freshest-window sample with the smallest round trip.
func (p *peerClock) best(now time.Time) (clockSample, bool) {
	var out clockSample
	ok := false
	for _, s := range p.samples {
		if now.Sub(s.at) > clockSampleMaxAge {
			continue
		}
		if !ok || s.rtt < out.rtt {
			out, ok = s, true
		}
	}
	return out, ok
}

// clockState is this node's clock bookkeeping.
type clockState struct {
	s      *Server
	bound  time.Duration
	groups []*groupclock.Clock

	mu      sync.Mutex
	peers   map[string]*peerClock
	median  time.Duration // this node minus the median clock
	inBound bool
	trusted bool
	reason  string // why this node may not lead ("" when it may)

	lastTransfer map[int]time.Time // enforce loop only

	mPeer    *prometheus.GaugeVec
	mMedian  prometheus.Gauge
	mBound   prometheus.Gauge
	mInBound prometheus.Gauge
}

func newClockState(s *Server) *clockState {
	c := &clockState{s: s, bound: s.cfg.MaxClockOffset, peers: map[string]*peerClock{}, inBound: true,
		lastTransfer: map[int]time.Time{}}
	c.mPeer = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tollgate_clock_peer_offset_seconds",
		Help: "This node's clock minus the peer's, RTT-corrected (smallest round trip of the recent samples)."}, []string{"peer"})
	c.mMedian = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_offset_seconds",
		Help: "This node's clock minus the median of every measured clock in the cluster (its own included)."})
	c.mBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_max_offset_seconds",
		Help: "The cluster's maximum clock offset (--max-clock-offset)."})
	c.mInBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_in_bound",
		Help: "1 when this node's clock is within the maximum offset of the cluster's median clock (it may lead), else 0."})
	c.mBound.Set(c.bound.Seconds())
	c.mInBound.Set(1)
	s.metrics.reg.MustRegister(c.mPeer, c.mMedian, c.mBound, c.mInBound)
	c.groups = make([]*groupclock.Clock, s.cfg.Groups)
	for g := range c.groups {
		// Mono is the node's own clock: time.Now's readings carry Go's
		// monotonic clock, so only a clock injected by a test (which has
		// none) makes elapsed time follow that clock's steps.
		c.groups[g] = groupclock.New(groupclock.Config{Wall: c.wall, Mono: s.cfg.Clock, Bound: c.bound, Trusted: c.isTrusted})
	}
	return c
}

// wall is the node's wall clock corrected by its offset to the cluster's
// median clock.
func (c *clockState) wall() time.Time {
	c.mu.Lock()
	m := c.median
	c.mu.Unlock()
	return c.s.cfg.Clock().Add(-m)
}

// isTrusted is read on every stamp (the admission hot path): computed once a
// round by probeAll, never from the member list here.
func (c *clockState) isTrusted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trusted
}

// groupMinute is group g's time as a Unix minute (what admission stamps).
func (c *clockState) groupMinute(g int) int64 { return c.groups[g].Now() / 60_000 }

// outOfBound is "" when this node may lead, else why not.
func (c *clockState) outOfBound() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// mayLeadReason is "" when this node may run leader sessions: its clock is
// within bound and every alive peer's clock was probed at least once (a node
// that just started does not stamp a group's time with a clock nobody has
// checked yet; a peer that is down counts once its probe failed).
func (c *clockState) mayLeadReason() string {
	if why := c.outOfBound(); why != "" {
		return why
	}
	for _, m := range alive(c.s.memberList()) {
		if m.ID == c.s.cfg.NodeID || m.GRPCAddr == "" {
			continue
		}
		c.mu.Lock()
		p := c.peers[m.ID]
		probed := p != nil && p.probed
		c.mu.Unlock()
		if !probed {
			return fmt.Sprintf("clock not measured yet: waiting for the first measurement of %s's clock", m.ID)
		}
	}
	return ""
}

// peerReason is why node id may not lead as this node measures it ("" when
// it may, or when it was not measured).
func (c *clockState) peerReason(id string) string {
	if id == c.s.cfg.NodeID {
		return c.outOfBound()
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[id]
	if p == nil {
		return ""
	}
	b, ok := p.best(now)
	if !ok {
		return ""
	}
	// The peer's clock minus the median: (me − median) − (me − peer).
	d := c.median - b.offset
	if d > c.bound || d < -c.bound {
		return fmt.Sprintf("%s's clock is %s from the cluster's median clock (max clock offset %s)", id, signed(d), c.bound)
	}
	return ""
}

func signed(d time.Duration) string {
	if d >= 0 {
		return "+" + d.String()
	}
	return d.String()
}

// medianOf picks the median of offsets (this node's own 0 included). With
// an even count the middle value closer to this node's clock is taken: a
// tie never makes a node out of bound.
func medianOf(offs []time.Duration) time.Duration {
	slices.Sort(offs)
	n := len(offs)
	if n%2 == 1 {
		return offs[n/2]
	}
	a, b := offs[n/2-1], offs[n/2]
	if abs(a) <= abs(b) {
		return a
	}
	return b
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// recomputeLocked derives the median, bound and trust from the samples of
// the other members alive.
func (c *clockState) recomputeLocked(aliveIDs map[string]bool) {
	alive := len(aliveIDs)
	now := time.Now()
	offs := []time.Duration{0}
	for id, p := range c.peers {
		if !aliveIDs[id] {
			continue
		}
		if b, ok := p.best(now); ok {
			offs = append(offs, b.offset)
		}
	}
	measured := len(offs) - 1
	c.median = medianOf(offs)
	c.inBound = abs(c.median) <= c.bound
	c.trusted = c.inBound && (alive == 0 || measured*2 > alive)
	c.reason = ""
	if !c.inBound {
		c.reason = fmt.Sprintf("clock out of bound: this node's clock is %s from the median of %d measured clocks (max clock offset %s); it does not lead any group until its clock is fixed",
			signed(c.median), len(offs), c.bound)
	}
}

// run probes peers and enforces the bound until the server stops.
func (c *clockState) run() {
	t := time.NewTicker(clockProbeEvery)
	defer t.Stop()
	for {
		c.probeAll()
		c.enforce()
		select {
		case <-c.s.closing:
			return
		case <-t.C:
		}
	}
}

func (c *clockState) probeAll() {
	var others []struct{ id, addr string }
	for _, m := range alive(c.s.memberList()) {
		if m.ID != c.s.cfg.NodeID && m.GRPCAddr != "" {
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
	c.mu.Lock()
	defer c.mu.Unlock()
	// A member that is not alive keeps its entry (a flapping member must not
	// count as never measured) but its clock does not count.
	aliveIDs := map[string]bool{}
	for _, o := range others {
		aliveIDs[o.id] = true
	}
	wasIn := c.inBound
	c.recomputeLocked(aliveIDs)
	for id := range aliveIDs {
		if p := c.peers[id]; p == nil || !p.probed {
			c.trusted = false
		}
	}
	if wasIn != c.inBound {
		if c.inBound {
			c.s.log.Info("clock back within bound of the cluster's", "median_offset", c.median, "max_clock_offset", c.bound)
		} else {
			c.s.log.Error("clock out of bound: this node will not lead any group", "median_offset", c.median, "max_clock_offset", c.bound)
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
func (c *clockState) probe(id, addr string) {
	var errText string
	var smp clockSample
	if c.s.admin == nil {
		return
	}
	cc, err := c.s.admin.conn(addr)
	// A short burst per round, keeping the smallest round trip: a sample's
	// error is at most half its round trip, and a loaded machine stretches
	// some of them.
	for i := range clockBurst {
		if err != nil {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), clockProbeTimeout)
		start := time.Now() // mono: the round trip
		wall0 := c.s.cfg.Clock()
		var resp *api.ClockNowResponse
		resp, err = api.NewClockClient(cc).Now(ctx, &api.ClockNowRequest{From: c.s.cfg.NodeID})
		cancel()
		if err == nil {
			rtt := time.Since(start)
			mid := wall0.Add(rtt / 2)
			if i == 0 || rtt < smp.rtt {
				smp = clockSample{offset: mid.Sub(time.Unix(0, resp.UnixNano)), rtt: rtt, at: time.Now()}
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
	if len(p.samples) < clockSamples {
		p.samples = append(p.samples, smp)
	} else {
		p.samples[p.next] = smp
		p.next = (p.next + 1) % clockSamples
	}
}

// enforce: a node out of bound stops every leader session and hands
// leadership away; back within bound, a group raft still lets it lead gets
// its session again.
func (c *clockState) enforce() {
	why := c.outOfBound()
	measured := c.mayLeadReason() == ""
	for g := range c.s.cfg.Groups {
		r := c.s.host.Raft(g)
		tr := c.s.trackers[g]
		if why == "" {
			// Not measured yet: wait for the probes (at most a probe
			// timeout), neither leading nor handing the group away.
			if measured && r.State() == raft.Leader && !tr.leading() && c.s.mayLead(g) {
				select {
				case c.s.leaderEvents <- leaderEvent{group: g, leader: true, recheck: true}:
				default:
				}
			}
			continue
		}
		if tr.leading() {
			c.s.log.Warn("clock out of bound: stopping the leader session", "group", g, "reason", why)
			tr.setLeader(false)
		}
		if r.State() != raft.Leader || time.Since(c.lastTransfer[g]) < clockTransferGap || !hasOtherVoter(r, c.s.cfg.NodeID) {
			continue
		}
		c.lastTransfer[g] = time.Now()
		to := c.inBoundVoter(r)
		c.s.log.Warn("clock out of bound: transferring leadership", "group", g, "to", to.ID, "reason", why)
		c.s.wg.Add(1)
		go func() {
			defer c.s.wg.Done()
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
				c.s.log.Warn("leadership transfer away from an out-of-bound clock failed; retrying", "group", g, "err", err)
			}
		}()
	}
}

// inBoundVoter is a voter of r other than this node whose clock this node
// measured within bound (zero when there is none).
func (c *clockState) inBoundVoter(r *raft.Raft) raft.Server {
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return raft.Server{}
	}
	now := time.Now()
	for _, srv := range fut.Configuration().Servers {
		id := string(srv.ID)
		if srv.Suffrage != raft.Voter || id == c.s.cfg.NodeID {
			continue
		}
		c.mu.Lock()
		p := c.peers[id]
		_, measured := p.bestOrNil(now)
		c.mu.Unlock()
		if measured && c.peerReason(id) == "" {
			return srv
		}
	}
	return raft.Server{}
}

// offsetFromMedian is node id's clock minus the median clock, as this node
// measures it (false: not measured).
func (c *clockState) offsetFromMedian(id string) (time.Duration, bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == c.s.cfg.NodeID {
		return c.median, true
	}
	b, ok := c.peers[id].bestOrNil(now)
	if !ok {
		return 0, false
	}
	return c.median - b.offset, true
}

// ClockStatus is the clock part of /api/v1/status.
type ClockStatus struct {
	MaxOffset    string            `json:"max_offset"`
	MaxOffsetNs  int64             `json:"max_offset_ns"`
	MedianOffset string            `json:"median_offset"` // this node minus the median clock
	MedianNs     int64             `json:"median_offset_ns"`
	InBound      bool              `json:"in_bound"`
	Reason       string            `json:"reason,omitempty"`
	Peers        []PeerClockStatus `json:"peers"`
}

// PeerClockStatus is one peer's measured offset.
type PeerClockStatus struct {
	Node     string `json:"node"`
	Offset   string `json:"offset"` // this node minus the peer
	OffsetNs int64  `json:"offset_ns"`
	RTTNs    int64  `json:"rtt_ns"`
	AgeNs    int64  `json:"age_ns"`
	Error    string `json:"error,omitempty"`
}

// offsets is this node's view as the Clock.Offsets answer.
func (c *clockState) offsets() *api.ClockOffsetsResponse {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &api.ClockOffsetsResponse{NodeId: c.s.cfg.NodeID, MaxOffsetNanos: int64(c.bound), MedianOffsetNanos: int64(c.median),
		InBound: c.inBound, Reason: c.reason, UnixNano: c.s.cfg.Clock().UnixNano()}
	for _, p := range c.peers {
		po := &api.PeerOffset{NodeId: p.id, GrpcAddress: p.addr, Error: p.lastErr}
		if b, ok := p.best(now); ok {
			po.OffsetNanos, po.RttNanos, po.AgeNanos = int64(b.offset), int64(b.rtt), int64(now.Sub(b.at))
		}
		out.Peers = append(out.Peers, po)
	}
	slices.SortFunc(out.Peers, func(a, b *api.PeerOffset) int {
		switch {
		case a.NodeId < b.NodeId:
			return -1
		case a.NodeId > b.NodeId:
			return 1
		}
		return 0
	})
	return out
}

func (c *clockState) status() *ClockStatus {
	o := c.offsets()
	st := &ClockStatus{MaxOffset: time.Duration(o.MaxOffsetNanos).String(), MaxOffsetNs: o.MaxOffsetNanos,
		MedianOffset: signed(time.Duration(o.MedianOffsetNanos)), MedianNs: o.MedianOffsetNanos, InBound: o.InBound, Reason: o.Reason}
	for _, p := range o.Peers {
		st.Peers = append(st.Peers, PeerClockStatus{Node: p.NodeId, Offset: signed(time.Duration(p.OffsetNanos)), OffsetNs: p.OffsetNanos,
			RTTNs: p.RttNanos, AgeNs: p.AgeNanos, Error: p.Error})
	}
	return st
}

// clockService is the Clock gRPC service.
type clockService struct {
	api.UnimplementedClockServer
	s *Server
}

func (cs *clockService) Now(context.Context, *api.ClockNowRequest) (*api.ClockNowResponse, error) {
	return &api.ClockNowResponse{NodeId: cs.s.cfg.NodeID, UnixNano: cs.s.cfg.Clock().UnixNano()}, nil
}

func (cs *clockService) Offsets(context.Context, *api.ClockOffsetsRequest) (*api.ClockOffsetsResponse, error) {
	return cs.s.clock.offsets(), nil
}
