package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Succession: which survivor of a dead leader asks for votes first.
//
// Without it, the two survivors of a three-voter group each start an election
// when their own randomised heartbeat timer fires. On a busy host those
// timers fire late and close together; both win each other's pre-vote (pre-vote
// changes no state), both vote for themselves at the same term, and the vote
// splits. raft then waits another randomised ElectionTimeout and tries again,
// sometimes two to four times: failovers of 2.5–3.6 s where one round takes
// under 1 s (BENCHMARKS.md, "A busy host").
//
// The tie is broken by a fixed order. Each group ranks its voters by ID,
// rotated by the group's number (so the first-ranked node differs between
// groups and leaderships stay spread). When the leader goes silent, the
// group's *successor* is the first-ranked voter other than that leader:
//
//   - the successor campaigns as raft always does (pre-vote, then vote);
//   - any other voter whose timer fires first does not campaign: it sends the
//     successor a TimeoutNow (the RPC a leader uses to hand over leadership),
//     which makes the successor start its election at once, and refuses its
//     own pre-vote requests for that round and the next ones, for up to
//     3×ElectionTimeout after the successor was last seen campaigning. It grants the successor's vote, so one round elects
//     the successor, at about the time the first of the survivors' timers
//     fires. A nudge not answered in time (a busy host) still holds: the
//     successor is alive and its own timer will fire.
//
// A successor that is down too, or whose MayCampaign refuses, is skipped:
// the next voter in rank order is asked (or, if that is this node, this node
// campaigns), so survivors that disagree on which leader went silent (one of
// them led briefly and stalled) still end on the same candidate. The hold
// ends when the successor refuses because it hears a leader or leads, and
// when this node refuses the successor's (pre-)vote (its log is behind this node's, so it cannot win):
// this node then starts its own election at once (a TimeoutNow delivered to
// its own raft, which makes a follower campaign). After 3×ElectionTimeout
// without a new leader and without a vote request from the successor (and
// after 12×ElectionTimeout in any case), the group is back to raft's own
// elections: the tie-break delays an election only while the successor is
// seen campaigning, and never prevents one.
//
// The successor accepts such a nudge only when it has itself not heard the
// leader for a whole HeartbeatTimeout (the leader's own transfer is accepted
// as before), and never while it leads: the nudge only brings forward an
// election its own timer would call at its next check. A follower that
// stalls and wakes to a fired timer therefore cannot start an election
// through its peer while the leader is alive, nor can a leader's stall that
// only one follower noticed: the peer refuses, and the first follower's
// pre-vote is refused as before (raft rejects pre-votes while it has a
// leader). (A first version accepted after 3/4 of HeartbeatTimeout; a 10-min
// steady run at load 36 then held 8 elections, in two bursts that followed
// leaders stepping down on their own lease, so which of them the nudge made
// could not be told: the stricter rule leaves no doubt.)
type succession struct {
	group int
	self  raft.ServerID
	// accept: how long the leader must have been silent for a nudge to be
	// accepted (HeartbeatTimeout); wait: how long a nudge's answer is
	// awaited (ElectionTimeout/2); holdMax: how long a silence may be left to
	// the successor (3×ElectionTimeout).
	accept, wait, holdMax time.Duration
	log                   *slog.Logger

	raft   atomic.Pointer[raft.Raft]     // set once raft is built
	leader atomic.Pointer[raft.ServerID] // last sender of an AppendEntries
	nudge  func(id raft.ServerID, addr raft.ServerAddress, req *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error
	// campaign delivers a TimeoutNow to this node's own raft (gate.go).
	campaign func() bool

	askMu     sync.Mutex
	mu        sync.Mutex
	episode   time.Time // raft's LastContact of the silence being decided
	succ      raft.Server
	skip      map[raft.ServerID]bool // the silent leader, successors found down
	heldSince time.Time
	holdUntil time.Time // zero: not decided in this episode
	lifted    bool      // this episode is left to raft's own elections
	lastNudge time.Time
	// downLeader and downEpisode: the dead leader last acted on
	// (leaderdown.go), and raft's LastContact then.
	downLeader  raft.ServerID
	downEpisode time.Time
	// behindFrom and behindAt: the last peer whose vote this node refused
	// for a log shorter than its own, while not holding off for it.
	behindFrom raft.ServerID
	behindAt   time.Time
	// heldOut counts campaigns after a hold for the dead leader's
	// successor ran out (heldTooLong).
	heldOut atomic.Uint64
}

// errYield is the yielding voter's decision on its own pre-vote requests;
// gate.go turns it into a refused pre-vote.
var errYield = errors.New("raftnode: holding off: the group's successor was asked to campaign first")

// errNudgeRefused answers a TimeoutNow from a peer while this node still
// hears the leader or leads.
var errNudgeRefused = errors.New("raftnode: campaign request refused")

func newSuccession(group int, self raft.ServerID, hb, et time.Duration, log *slog.Logger) *succession {
	return &succession{group: group, self: self, accept: hb, wait: et / 2, holdMax: 3 * et, log: log}
}

// holdLimit caps a hold at holdLimit×holdMax (12×ElectionTimeout) however
// long the successor is seen campaigning without winning.
const holdLimit = 4

// errNoAnswer: the successor did not answer the nudge in time.
var errNoAnswer = errors.New("no answer")

// heard records the sender of an AppendEntries (heartbeat or entries): the
// leader this node follows. raft forgets its leader when the heartbeat timer
// fires, before the election this package decides on.
func (s *succession) heard(header raft.RPCHeader) {
	if s == nil || len(header.ID) == 0 {
		return
	}
	if p := s.leader.Load(); p != nil && string(*p) == string(header.ID) {
		return
	}
	id := raft.ServerID(header.ID)
	s.leader.Store(&id)
}

// successorOf is the first voter of servers, in group g's rotated order,
// that is not in skip (the silent leader, and successors found down). ok is
// false with fewer than three voters (with two, the survivor of a dead
// leader has no quorum; with one there is no one to ask) or none left.
func successorOf(g int, servers []raft.Server, skip map[raft.ServerID]bool) (raft.Server, bool) {
	var voters []raft.Server
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, s)
		}
	}
	n := len(voters)
	if n < 3 {
		return raft.Server{}, false
	}
	slices.SortFunc(voters, func(a, b raft.Server) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	for i := range n {
		v := voters[(i+g)%n]
		if !skip[v.ID] {
			return v, true
		}
	}
	return raft.Server{}, false
}

// yield is called before each pre-vote request this node sends (one per
// peer, concurrently, from raft's per-peer goroutines, never its main loop).
// It returns errYield when this node should not campaign in this round.
func (s *succession) yield(header raft.RPCHeader) error {
	if s == nil {
		return nil
	}
	r := s.raft.Load()
	if r == nil {
		return nil
	}
	// One round's requests decide once (askMu); mu guards the state and is
	// never held across a nudge, so the successor's vote requests (watching)
	// are not delayed by one.
	s.askMu.Lock()
	defer s.askMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ep := r.LastContact(); !ep.Equal(s.episode) {
		s.episode, s.holdUntil, s.lifted, s.lastNudge = ep, time.Time{}, false, time.Time{}
	}
	if s.lifted {
		return nil
	}
	now := time.Now()
	if s.holdUntil.IsZero() {
		var leader raft.ServerID
		if p := s.leader.Load(); p != nil {
			leader = *p
		}
		s.skip = map[raft.ServerID]bool{leader: true}
		succ, ok := successorOf(s.group, r.GetConfiguration().Configuration().Servers, s.skip)
		if !ok || succ.ID == s.self {
			s.lifted = true
			return nil
		}
		s.succ, s.holdUntil, s.heldSince = succ, now.Add(s.holdMax), now
		s.log.Info("raftnode: election: leader silent, the group's successor campaigns first", "group", s.group,
			"successor", succ.ID, "silent_leader", leader)
	} else if now.After(s.holdUntil) {
		s.lifted = true
		s.log.Info("raftnode: election: no leader after holding off; campaigning", "group", s.group,
			"successor", s.succ.ID, "held", s.holdMax)
		return nil
	}
	if !s.lastNudge.IsZero() && now.Sub(s.lastNudge) < s.wait {
		return errYield // the other peers' requests of the same round
	}
	for {
		succ := s.succ
		s.mu.Unlock()
		err := s.ask(succ, header)
		s.mu.Lock()
		s.lastNudge = time.Now()
		if s.lifted {
			return nil // refused() decided meanwhile: this node campaigns
		}
		if err == nil || errors.Is(err, errNoAnswer) {
			return errYield
		}
		if strings.Contains(err.Error(), errNudgeRefused.Error()) {
			// It hears a leader, or leads: no tie to break.
			s.lifted = true
			s.log.Info("raftnode: election: the successor refused the campaign; campaigning", "group", s.group,
				"successor", s.succ.ID, "error", err)
			return nil
		}
		// Down too, or it may not lead: the next in rank. Every survivor
		// that finds it so agrees on the next one, where a survivor that
		// simply campaigned would split the vote with the others.
		s.skip[s.succ.ID] = true
		next, ok := successorOf(s.group, r.GetConfiguration().Configuration().Servers, s.skip)
		s.log.Info("raftnode: election: the successor cannot campaign; the next in rank does", "group", s.group,
			"successor", s.succ.ID, "next", next.ID, "error", err)
		if !ok || next.ID == s.self {
			s.lifted = true
			return nil
		}
		s.succ, s.holdUntil = next, time.Now().Add(s.holdMax)
	}
}

// led records that this node became leader: if it stalls and loses the
// leadership, it is the silent leader of the election that follows, as it
// is for the followers that heard it last.
func (s *succession) led() {
	if s == nil {
		return
	}
	id := s.self
	s.leader.Store(&id)
}

// watching says whether an incoming (pre-)vote request comes from the
// successor this node is holding off for. Such a request is proof that the
// successor is alive and campaigning, so the hold is extended by holdMax
// from now: on a starved host the successor's rounds can time out before
// this node's answers reach it, and a second campaigner would only split
// the vote.
func (s *succession) watching(from []byte) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holdUntil.IsZero() || s.lifted || string(s.succ.ID) != string(from) {
		return false
	}
	until := time.Now().Add(s.holdMax)
	if limit := s.heldSince.Add(holdLimit * s.holdMax); until.After(limit) {
		until = limit // whatever happens, raft's own elections resume
	}
	if until.After(s.holdUntil) {
		s.holdUntil = until
	}
	return true
}

// refused is called when this node refused the successor's (pre-)vote while
// holding off for it: the successor cannot win (its log is behind this
// node's), so this node campaigns at once.
func (s *succession) refused() {
	s.mu.Lock()
	if s.holdUntil.IsZero() || s.lifted {
		s.mu.Unlock()
		return
	}
	s.lifted = true
	succ := s.succ.ID
	s.mu.Unlock()
	s.log.Info("raftnode: election: refused the successor's vote (its log is behind); campaigning", "group", s.group,
		"successor", succ)
	if s.campaign != nil {
		s.campaign()
	}
}

// ask sends succ a TimeoutNow and waits at most s.wait for its answer.
func (s *succession) ask(succ raft.Server, header raft.RPCHeader) error {
	done := make(chan error, 1)
	go func() {
		var resp raft.TimeoutNowResponse
		done <- s.nudge(succ.ID, succ.Address, &raft.TimeoutNowRequest{RPCHeader: header}, &resp)
	}()
	t := time.NewTimer(s.wait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w within %v", errNoAnswer, s.wait)
	}
}

// admit decides an incoming TimeoutNow: the leader's own transfer passes;
// from any other peer it is a successor nudge, accepted only while this node
// does not lead and has not heard the leader for s.accept.
func (s *succession) admit(req *raft.TimeoutNowRequest) error {
	if s == nil {
		return nil
	}
	r := s.raft.Load()
	if r == nil {
		return nil
	}
	from := raft.ServerID(req.ID)
	if _, leader := r.LeaderWithID(); leader != "" && leader == from {
		return nil
	}
	if r.State() == raft.Leader {
		return fmt.Errorf("%w: %s leads group %d", errNudgeRefused, s.self, s.group)
	}
	if silent := time.Since(r.LastContact()); silent < s.accept {
		return fmt.Errorf("%w: %s heard the leader of group %d %v ago", errNudgeRefused, s.self, s.group, silent.Round(time.Millisecond))
	}
	return nil
}
