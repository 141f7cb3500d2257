package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/groupclock"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// Clocks. The cluster tolerates node clocks up to MaxClockOffset apart. Every
// node measures its offset to each peer about once a second (Clock.Now over
// gRPC, corrected by half the round trip, the sample with the smallest round
// trip of the last few kept) and compares its own clock with the median of
// all measured clocks, its own included.
//
// A node's clock is confirmed when a majority of the groups' voters (itself
// included) have clocks within the bound of its own, each measured with a
// fresh sample taken since that peer last started, and it is within the bound
// of the median. Only a confirmed node leads: an unconfirmed one asks for no
// votes and refuses leadership transfers (raftnode's gate), runs no leader
// session, hands leadership it holds to a peer it measured within bound,
// and says why in /readyz, status and metrics; it still serves as a
// follower. A median alone is not enough: with two live clocks of three it
// is the one nearer this node's own, so each of two disagreeing nodes would
// find itself right. With a majority required, two clocks that disagree
// confirm neither (the group has no leader until one is fixed or the third
// node is back), and a node that just restarted leads nothing until a
// majority measured it and it measured them. Each group's time comes from a
// groupclock.Clock, fed by the entries the group applies and by this node's
// wall clock corrected by the median offset, so no single wrong clock moves
// a group's time by more than the bound.

const (
	clockProbeEvery   = time.Second
	clockProbeTimeout = 2 * time.Second
	clockSamples      = 8                // samples kept per peer (smallest RTT wins)
	clockBurst        = 3                // probes per peer per round (smallest RTT kept)
	clockSampleMaxAge = 30 * time.Second // older samples do not count
	// clockFreshAge: a peer's clock confirms this node's only while its
	// newest sample is at most this old (a peer that stopped answering
	// stops counting before serf calls it failed).
	clockFreshAge = 10 * time.Second
	// clockProbeUnconfirmed: the probe period while this node's clock is not
	// confirmed (just started, or a peer restarted), so it can lead again
	// soon after a majority answers.
	clockProbeUnconfirmed = 250 * time.Millisecond
	// clockBootHeader is the gRPC response header of Clock.Now naming the
	// answering process's boot (random per start): a prober that sees it
	// change drops that peer's earlier samples, which measured a clock the
	// peer may no longer have.
	clockBootHeader  = "tollgate-clock-boot"
	clockTransferGap = 2 * time.Second // between leadership hand-offs of one group
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
	boot     string    // the peer's boot its samples were taken in ("" unknown)
	lastAt   time.Time // mono: the newest sample
	lastErr  string
	probed   bool // a probe finished (answered or failed)
}

func (p *peerClock) bestOrNil(now time.Time) (clockSample, bool) {
	if p == nil {
		return clockSample{}, false
	}
	return p.best(now)
}

// fresh reports whether the newest sample is recent enough to confirm a clock.
func (p *peerClock) fresh(now time.Time) bool {
	return p != nil && len(p.samples) > 0 && now.Sub(p.lastAt) <= clockFreshAge
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

	boot string // this process's boot id (clockBootHeader)
	// host is set once raft has started (raft's goroutines call the gate
	// before Server.host is assigned).
	host atomic.Pointer[raftnode.Host]

	// ok mirrors reason == "" for readers on hot paths (raft's vote gate,
	// leads, every group-time stamp).
	ok atomic.Bool

	mu      sync.Mutex
	peers   map[string]*peerClock
	median  time.Duration // this node minus the median clock
	inBound bool          // confirmed: may lead (reason == "")
	reason  string        // why this node may not lead ("" when it may)
	voters  int           // the most voters of any group, when last computed
	agree   int           // clocks within bound of this one (its own included)

	lastTransfer map[int]time.Time // enforce loop only

	mPeer    *prometheus.GaugeVec
	mMedian  prometheus.Gauge
	mBound   prometheus.Gauge
	mInBound prometheus.Gauge
}

func newClockState(s *Server) *clockState {
	c := &clockState{s: s, bound: s.cfg.MaxClockOffset, peers: map[string]*peerClock{},
		reason:       "clock not confirmed yet: no peer's clock measured since this node started",
		boot:         newBootID(),
		lastTransfer: map[int]time.Time{}}
	c.mPeer = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tollgate_clock_peer_offset_seconds",
		Help: "This node's clock minus the peer's, RTT-corrected (smallest round trip of the recent samples)."}, []string{"peer"})
	c.mMedian = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_offset_seconds",
		Help: "This node's clock minus the median of every measured clock in the cluster (its own included)."})
	c.mBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_max_offset_seconds",
		Help: "The cluster's maximum clock offset (--max-clock-offset)."})
	c.mInBound = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_clock_in_bound",
		Help: "1 when this node's clock is confirmed (within the maximum offset of a majority of the voters' clocks and of the median clock: it may lead), else 0."})
	c.mBound.Set(c.bound.Seconds())
	c.mInBound.Set(0)
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
func (c *clockState) isTrusted() bool { return c.ok.Load() }

// confirmed reports whether this node's clock is confirmed against a
// majority (it may lead); cached, for hot paths.
func (c *clockState) confirmed() bool { return c.ok.Load() }

// campaignGate is raftnode's MayCampaign: nil while this node may lead.
// Recomputed on the spot (elections and transfers are rare): the voters may
// have changed since the last probe round, e.g. the first configuration of a
// cluster being formed.
func (c *clockState) campaignGate() error {
	if !c.ok.Load() {
		if why := c.outOfBound(); why != "" {
			return errors.New(why)
		}
	}
	c.refresh()
	if why := c.outOfBound(); why != "" {
		return errors.New(why)
	}
	return nil
}

// reasonKind is the part of a reason before its first colon ("" when
// confirmed): logged when it changes, not on every new figure.
func reasonKind(why string) string {
	k, _, _ := strings.Cut(why, ":")
	return k
}

func newBootID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
// confirmed against a majority of the voters' clocks (recomputeLocked). It
// recomputes from the samples held (no probe), so a change of membership or
// configuration counts at once.
func (c *clockState) mayLeadReason() string {
	c.refresh()
	return c.outOfBound()
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
	b, ok := p.bestOrNil(now)
	if !ok || !p.fresh(now) {
		return fmt.Sprintf("%s's clock has not been measured since it started", id)
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

// voterCount is the most voters any group's configuration has, and the ids
// of every group's voters: whose clocks count. Before any configuration is
// known (a node that has not joined or bootstrapped yet) it is the number of
// members serf knows (not departed) or --bootstrap-expect if larger: never 1
// by default, or a node of a cluster being formed would confirm itself alone
// and could win the first election with any clock.
func (c *clockState) voterCount() (int, map[string]bool) {
	n, ids := 0, map[string]bool{}
	host := c.host.Load()
	if host == nil {
		return max(c.s.cfg.BootstrapExpect, 1), ids
	}
	for g := range c.s.cfg.Groups {
		r := host.Raft(g)
		if r == nil {
			continue
		}
		fut := r.GetConfiguration() // a copy: does not wait for raft's loop
		if fut.Error() != nil {
			continue
		}
		k := 0
		for _, srv := range fut.Configuration().Servers {
			if srv.Suffrage == raft.Voter {
				k++
				ids[string(srv.ID)] = true
			}
		}
		n = max(n, k)
	}
	if n == 0 {
		known := 0
		for _, m := range c.s.memberList() {
			if m.Status != membership.StatusLeft {
				known++
			}
		}
		n = max(known, c.s.cfg.BootstrapExpect, 1)
	}
	return n, ids
}

// refresh recomputes the bound from the samples held, without probing.
func (c *clockState) refresh() {
	if c.host.Load() == nil {
		return // membership and raft not started yet: keep "not confirmed"
	}
	voters, voterIDs := c.voterCount()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recomputeLocked(voters, voterIDs)
}

// recomputeLocked derives the median and whether this node's clock is
// confirmed, from the voters' fresh samples (voterIDs empty: no
// configuration known, every peer counts). Freshness, not serf's view, says
// whether a peer's clock still counts: only alive members are probed, so a
// peer serf calls failed stops counting within clockFreshAge, and one that
// serf wrongly suspects on a loaded host keeps counting meanwhile (the
// leader does not drop its groups over a gossip hiccup).
func (c *clockState) recomputeLocked(voters int, voterIDs map[string]bool) {
	now := time.Now()
	offs := []time.Duration{0}
	agree := 1
	var far []string
	for id, p := range c.peers {
		if (len(voterIDs) > 0 && !voterIDs[id]) || !p.fresh(now) {
			continue
		}
		b, ok := p.best(now)
		if !ok {
			continue
		}
		offs = append(offs, b.offset)
		if abs(b.offset) <= c.bound {
			agree++
		} else {
			far = append(far, fmt.Sprintf("%s %s", id, signed(-b.offset)))
		}
	}
	slices.Sort(far)
	need := voters/2 + 1
	c.median = medianOf(offs)
	c.voters, c.agree = voters, agree
	switch {
	case abs(c.median) > c.bound:
		c.reason = fmt.Sprintf("clock out of bound: this node's clock is %s from the median of %d measured clocks (max clock offset %s); it does not lead any group until its clock is fixed",
			signed(c.median), len(offs), c.bound)
	case agree < need && len(far) > 0:
		c.reason = fmt.Sprintf("clock not confirmed: only %d of the %d voters' clocks (this one included) are within the max clock offset %s of this node's, a majority (%d) is needed (measured: %s); it does not lead any group until a majority agrees",
			agree, voters, c.bound, need, strings.Join(far, ", "))
	case agree < need:
		c.reason = fmt.Sprintf("clock not confirmed: %d of the %d voters' clocks (this one included) measured since they started, a majority (%d) is needed; it does not lead any group until then",
			agree, voters, need)
	default:
		c.reason = ""
	}
	c.inBound = c.reason == ""
	c.ok.Store(c.inBound)
}

// run probes peers and enforces the bound until the server stops.
func (c *clockState) run() {
	for {
		started := time.Now()
		c.probeAll()
		c.enforce()
		wait := clockProbeEvery
		if !c.confirmed() {
			wait = clockProbeUnconfirmed
		}
		t := time.NewTimer(max(0, wait-time.Since(started)))
		select {
		case <-c.s.closing:
			t.Stop()
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
	voters, voterIDs := c.voterCount()
	c.mu.Lock()
	defer c.mu.Unlock()
	wasWhy := c.reason
	c.recomputeLocked(voters, voterIDs)
	if reasonKind(wasWhy) != reasonKind(c.reason) {
		if c.inBound {
			c.s.log.Info("clock confirmed: within bound of a majority of the voters' clocks; this node may lead", "median_offset", c.median,
				"agree", c.agree, "voters", c.voters, "max_clock_offset", c.bound)
		} else {
			c.s.log.Error("this node will not lead any group", "reason", c.reason, "median_offset", c.median, "max_clock_offset", c.bound)
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
	var errText, boot string
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
		var md metadata.MD
		resp, err = api.NewClockClient(cc).Now(ctx, &api.ClockNowRequest{From: c.s.cfg.NodeID}, grpc.Header(&md))
		cancel()
		if err == nil {
			if v := md.Get(clockBootHeader); len(v) > 0 {
				boot = v[0]
			}
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
	if boot != "" && boot != p.boot {
		// The peer restarted (or is first seen): what was measured before
		// says nothing about the clock it runs with now.
		if p.boot != "" {
			c.s.log.Info("peer restarted: its earlier clock samples no longer count", "peer", id)
		}
		p.samples, p.next, p.boot = p.samples[:0], 0, boot
	}
	p.lastAt = smp.at
	if len(p.samples) < clockSamples {
		p.samples = append(p.samples, smp)
	} else {
		p.samples[p.next] = smp
		p.next = (p.next + 1) % clockSamples
	}
}

// enforce: a node whose clock is not confirmed stops every leader session
// and hands leadership away; confirmed again, a group raft still lets it
// lead gets its session again.
func (c *clockState) enforce() {
	why := c.mayLeadReason()
	for g := range c.s.cfg.Groups {
		r := c.s.host.Raft(g)
		tr := c.s.trackers[g]
		if why == "" {
			if r.State() == raft.Leader && !tr.leading() && c.s.mayLead(g) {
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
	for _, srv := range fut.Configuration().Servers {
		id := string(srv.ID)
		if srv.Suffrage != raft.Voter || id == c.s.cfg.NodeID {
			continue
		}
		if c.peerReason(id) == "" { // measured since it started, within bound
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

func (cs *clockService) Now(ctx context.Context, _ *api.ClockNowRequest) (*api.ClockNowResponse, error) {
	// Before the answer: a header sent with it costs no extra round trip.
	_ = grpc.SetHeader(ctx, metadata.Pairs(clockBootHeader, cs.s.clock.boot))
	return &api.ClockNowResponse{NodeId: cs.s.cfg.NodeID, UnixNano: cs.s.cfg.Clock().UnixNano()}, nil
}

func (cs *clockService) Offsets(context.Context, *api.ClockOffsetsRequest) (*api.ClockOffsetsResponse, error) {
	return cs.s.clock.offsets(), nil
}
