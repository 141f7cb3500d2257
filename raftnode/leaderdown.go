package raftnode

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// A dead leader seen at once: a refused connection instead of a silent timer.
//
// raft learns that its leader is gone only when its heartbeat timer finds no
// contact for HeartbeatTimeout (randomised up to twice that): 400–800 ms by
// default, most of a failover. When the leader's process dies (a crash, an
// OOM kill, SIGKILL) its host's kernel closes every socket the process held:
// the listener first goes away, and the connections the leader dialed to
// replicate to this node end. So when a connection this node accepted ends
// (a read meets EOF or a reset) while it follows a leader, it dials the
// leader's raft port once, and twice more within 100 ms (the kernel closes a
// dead process's sockets in file order, so the listener may outlive a
// connection by a moment). Only a refused connection counts as the leader's
// death: a live process always accepts on its port, a partition or a dead
// host drops packets (a timeout, which proves nothing), and a connection
// that simply ended (the leader's pool closing a spare) finds the port
// answering. Then, for that group:
//
//   - the group's successor (succession.go: the first survivor in the
//     group's rank order) starts its election at once, as a leader's
//     TimeoutNow would make it: one vote round, with no pre-vote, since its
//     peer still names the dead leader and would refuse a pre-vote;
//   - the other survivor holds off for the successor as if its own timer
//     had fired, so that if it refuses the successor's vote (the
//     successor's log is behind its own) it campaigns at once; and if no
//     leader has come forward within deadLeaderHold (the successor's
//     campaign failed, or never reached this node), it campaigns itself
//     rather than wait out raft's timers.
//
// The cost is one TCP connect (and close) per ended connection, shared by
// every group that follows the same leader (one probe per address in
// flight; a refusal is reused for probeReuse, an answer is not: the port
// may close a moment later). The gate (Config.MayCampaign)
// still decides whether the campaign's vote requests leave the node. A
// wrongly refused probe (the leader's listener closed while its raft still
// runs: only during its own shutdown) costs the group one election, never
// safety: votes still check terms and logs.

// probeReuse is how long a refused probe serves other groups' questions
// about the same address.
const probeReuse = 200 * time.Millisecond

// probeTimeout bounds one connection attempt of a probe: a refused
// connection is answered within a round trip; anything slower is not
// evidence of a dead process.
const probeTimeout = 250 * time.Millisecond

// deadLeaderHold is how long the other survivor holds off for the successor
// after the dead-leader probe before campaigning itself: a successor's
// election is one round trip (tens of milliseconds), so this only acts when
// its campaign failed: it knows no configuration yet (a voter whose log is
// still empty computes no successor and has no peers to ask), its gate is
// shut, or its vote requests are lost. Without this the group would wait
// for raft's timers (TestDeadLeaderSuccessorSilent).
const deadLeaderHold = 500 * time.Millisecond

// campaignFaultForTest, set by tests only, makes a successor's campaign
// after the dead-leader probe fail, as the cases above do.
var campaignFaultForTest atomic.Pointer[func(group int, self raft.ServerID) bool]

// probeRetries are the delays before the probe's second and third attempts.
var probeRetries = []time.Duration{30 * time.Millisecond, 70 * time.Millisecond}

// downProbe answers "does this raft address refuse connections?" for the
// groups of one host, one probe per address at a time.
type downProbe struct {
	dial func(ctx context.Context, endpoint string) error

	mu      sync.Mutex
	probes  map[string]*probe
	made    atomic.Uint64 // probes made (not answers reused)
	refused atomic.Uint64 // probes answered "refused": leaders found dead
	fast    atomic.Uint64 // elections started because of one
}

type probe struct {
	done    chan struct{}
	refused bool
	at      time.Time // when done was closed
}

func newDownProbe() *downProbe {
	return &downProbe{
		probes: map[string]*probe{},
		dial: func(ctx context.Context, endpoint string) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", endpoint)
			if err != nil {
				return err
			}
			return c.Close()
		},
	}
}

// isRefused reports whether address's raft port refuses connections, in
// any of three attempts over about 100 ms.
func (p *downProbe) isRefused(ctx context.Context, address raft.ServerAddress) bool {
	endpoint, _ := SplitIncarnation(string(address))
	p.mu.Lock()
	if pr, ok := p.probes[endpoint]; ok {
		select {
		case <-pr.done:
			// Only a refusal is reused: a port that answered before this
			// connection ended says nothing of the process now.
			if pr.refused && time.Since(pr.at) < probeReuse {
				p.mu.Unlock()
				return true
			}
		default:
			p.mu.Unlock()
			select {
			case <-pr.done:
				return pr.refused
			case <-ctx.Done():
				return false
			}
		}
	}
	pr := &probe{done: make(chan struct{})}
	p.probes[endpoint] = pr
	p.mu.Unlock()
	p.made.Add(1)

	refused := false
	for i := 0; ; i++ {
		actx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := p.dial(actx, endpoint)
		cancel()
		if errors.Is(err, syscall.ECONNREFUSED) {
			refused = true
			break
		}
		if i == len(probeRetries) {
			break
		}
		select {
		case <-time.After(probeRetries[i]):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	if refused {
		p.refused.Add(1)
	}
	p.mu.Lock()
	pr.refused, pr.at = refused, time.Now()
	close(pr.done)
	p.mu.Unlock()
	return refused
}

// LeaderDownStats count the dead leaders this host found by a refused
// connection, and the elections it started at once because of them.
type LeaderDownStats struct {
	// Probes counts the probes of a leader's raft port made after one of
	// its connections ended.
	Probes uint64
	// Refused counts probes of a leader's raft port that were refused.
	Refused uint64
	// Campaigns counts elections this node started at once as the
	// successor of a leader found dead.
	Campaigns uint64
	// HeldOut counts elections this node started when it had held off for
	// a dead leader's successor for deadLeaderHold and no leader came.
	HeldOut uint64
}

// LeaderDownStats reports the host's dead-leader probes (leaderdown.go).
func (h *Host) LeaderDownStats() LeaderDownStats {
	st := LeaderDownStats{Probes: h.down.made.Load(), Refused: h.down.refused.Load(), Campaigns: h.down.fast.Load()}
	if gs := h.groups.Load(); gs != nil {
		for _, g := range *gs {
			if g != nil && g.trans != nil && g.trans.succ != nil {
				st.HeldOut += g.trans.succ.heldOut.Load()
			}
		}
	}
	return st
}

// connEnded is group g's layer hook: a connection a peer dialed to this node
// ended. If this node follows a leader whose raft port now refuses
// connections, the successor campaigns and the other survivor holds off for
// it (see the top of this file).
func (h *Host) connEnded(s *succession) {
	r := s.raft.Load()
	if r == nil || r.State() != raft.Follower {
		return
	}
	addr, leader := r.LeaderWithID()
	if leader == "" {
		// raft forgets its leader on a vote request of a higher term: the
		// successor's, when its own probe was quicker. The leader is then
		// the last sender of an AppendEntries (succession.heard).
		if p := s.leader.Load(); p != nil {
			leader = *p
			addr = addressOf(r, leader)
		}
	}
	if leader == "" || addr == "" || leader == s.self {
		return
	}
	ctx, cancel := context.WithTimeout(h.life, 2*time.Second)
	defer cancel()
	if !h.down.isRefused(ctx, addr) {
		return
	}
	if _, now := r.LeaderWithID(); (now != "" && now != leader) || r.State() != raft.Follower {
		return // a new leader (or this node campaigns) meanwhile
	}
	if s.leaderDown(r, leader) {
		h.down.fast.Add(1)
	}
}

// addressOf is id's address in r's latest configuration ("" if absent).
func addressOf(r *raft.Raft, id raft.ServerID) raft.ServerAddress {
	cf := r.GetConfiguration()
	if cf.Error() != nil {
		return ""
	}
	for _, srv := range cf.Configuration().Servers {
		if srv.ID == id {
			return srv.Address
		}
	}
	return ""
}

// leaderDown acts on the death of leader, found by a refused connection:
// the successor campaigns at once (true); another survivor holds off for the
// successor as yield would after its own timer (false), unless it has just
// refused the successor's vote for a shorter log (the successor's own probe
// can be quicker): then it campaigns itself (true).
func (s *succession) leaderDown(r *raft.Raft, leader raft.ServerID) bool {
	cf := r.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	skip := map[raft.ServerID]bool{leader: true}
	succ, ok := successorOf(s.group, cf.Configuration().Servers, skip)
	if !ok {
		return false
	}
	// Several of the leader's connections end together: act once per
	// silence (raft's last contact with the leader marks it).
	ep := r.LastContact()
	s.mu.Lock()
	if s.downLeader == leader && s.downEpisode.Equal(ep) {
		s.mu.Unlock()
		return false
	}
	s.downLeader, s.downEpisode = leader, ep
	s.mu.Unlock()
	if succ.ID == s.self {
		s.log.Info("raftnode: election: the leader's raft port refuses connections (its process is gone); the group's successor campaigns now",
			"group", s.group, "dead_leader", leader)
		if f := campaignFaultForTest.Load(); f != nil && (*f)(s.group, s.self) {
			return false
		}
		return s.campaign != nil && s.campaign()
	}
	s.mu.Lock()
	if s.behindFrom == succ.ID && time.Since(s.behindAt) < s.holdMax {
		// The successor already asked, and this node refused it: its log
		// is behind, so it cannot win. This node campaigns instead.
		s.behindFrom = ""
		s.mu.Unlock()
		s.log.Info("raftnode: election: the leader's raft port refuses connections, and this node refused the successor's vote (its log is behind); campaigning",
			"group", s.group, "successor", succ.ID, "dead_leader", leader)
		return s.campaign != nil && s.campaign()
	}
	defer s.mu.Unlock()
	if !ep.Equal(s.episode) || s.holdUntil.IsZero() {
		now := time.Now()
		s.episode, s.skip, s.succ = ep, skip, succ
		s.holdUntil, s.heldSince, s.lifted, s.lastNudge = now.Add(s.holdMax), now, false, time.Time{}
		s.log.Info("raftnode: election: the leader's raft port refuses connections (its process is gone); holding off for the group's successor",
			"group", s.group, "successor", succ.ID, "dead_leader", leader)
		time.AfterFunc(deadLeaderHold, func() { s.heldTooLong(leader, ep) })
	}
	return false
}

// heldTooLong campaigns if this node still holds off, in the same silence,
// for the successor of the dead leader deadLeaderHold after the probe found
// it dead, and no other leader has come forward.
func (s *succession) heldTooLong(dead raft.ServerID, ep time.Time) {
	r := s.raft.Load()
	if r == nil || r.State() != raft.Follower {
		return
	}
	if _, l := r.LeaderWithID(); l != "" && l != dead {
		return
	}
	s.mu.Lock()
	if !s.episode.Equal(ep) || s.holdUntil.IsZero() || s.lifted {
		s.mu.Unlock()
		return
	}
	s.lifted = true
	succ := s.succ.ID
	s.mu.Unlock()
	s.log.Info("raftnode: election: no leader from the successor after the dead-leader probe; campaigning",
		"group", s.group, "successor", succ, "dead_leader", dead, "held", deadLeaderHold)
	if s.campaign != nil && s.campaign() {
		s.heldOut.Add(1)
	}
}

// refusedBehind records that this node refused from's vote request, not
// holding off for it when the request arrived, if from's log (ending at
// last) is shorter than this node's; if it holds off for from by now, it
// campaigns as refused does.
func (s *succession) refusedBehind(from raft.ServerID, last uint64) {
	r := s.raft.Load()
	if r == nil || last >= r.LastIndex() {
		return
	}
	s.mu.Lock()
	if !s.holdUntil.IsZero() && !s.lifted && s.succ.ID == from {
		// The hold began while the request was on its way to raft.
		s.mu.Unlock()
		s.refused()
		return
	}
	s.behindFrom, s.behindAt = from, time.Now()
	s.mu.Unlock()
}
