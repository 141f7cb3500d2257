package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
//     own pre-vote requests for that round. It then grants the successor's
//     vote, so one round elects the successor, at the time the first of the
//     survivors' timers fires.
//
// A voter yields at most once per silence of the leader (keyed by raft's
// LastContact): if the successor does not win within that round (its log is
// behind, it died too, it cannot lead), the next round is raft's own
// election. If the successor refuses or does not answer within
// ElectionTimeout/2, the voter campaigns in the same round.
//
// The successor accepts such a nudge only when it has itself not heard the
// leader for 3/4 of HeartbeatTimeout (the leader's own transfer is accepted
// as before), and never while it leads. A follower that stalls and wakes to a
// fired timer therefore cannot start an election through its peer while the
// leader is alive: the peer still hears the leader, refuses, and the stalled
// follower's pre-vote is refused as before (raft rejects pre-votes while it
// has a leader). Steady-state clusters hold no more elections than before.
type succession struct {
	group int
	self  raft.ServerID
	// accept: how long the leader must have been silent for a nudge to be
	// accepted (3/4 HeartbeatTimeout); wait: how long a nudge's answer is
	// awaited (ElectionTimeout/2).
	accept, wait time.Duration
	log          *slog.Logger

	raft   atomic.Pointer[raft.Raft]     // set once raft is built
	leader atomic.Pointer[raft.ServerID] // last sender of an AppendEntries
	nudge  func(id raft.ServerID, addr raft.ServerAddress, req *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error

	mu        sync.Mutex
	episode   time.Time // raft's LastContact when this node last decided
	decidedAt time.Time
	held      bool
}

// errYield is the yielding voter's answer to its own pre-vote requests. Like
// every gate answer it must not contain "unexpected command" (gate.go).
var errYield = errors.New("raftnode: holding off: the group's successor was asked to campaign first")

// errNudgeRefused answers a TimeoutNow from a peer while this node still
// hears the leader or leads.
var errNudgeRefused = errors.New("raftnode: campaign request refused")

func newSuccession(group int, self raft.ServerID, hb, et time.Duration, log *slog.Logger) *succession {
	return &succession{group: group, self: self, accept: hb * 3 / 4, wait: et / 2, log: log}
}

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
// that is not leader. ok is false with fewer than three voters (with two,
// the survivor of a dead leader has no quorum; with one there is no one to
// ask).
func successorOf(g int, servers []raft.Server, leader raft.ServerID) (raft.Server, bool) {
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
		if v.ID != leader {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	episode := r.LastContact()
	if !s.decidedAt.IsZero() && s.episode.Equal(episode) {
		if s.held && time.Since(s.decidedAt) < s.wait {
			return errYield // the other peers' requests of the same round
		}
		return nil // yielded once for this silence already: campaign
	}
	s.episode, s.decidedAt, s.held = episode, time.Now(), false
	var leader raft.ServerID
	if p := s.leader.Load(); p != nil {
		leader = *p
	}
	succ, ok := successorOf(s.group, r.GetConfiguration().Configuration().Servers, leader)
	if !ok || succ.ID == s.self {
		return nil
	}
	err := s.ask(succ, header)
	if err != nil {
		s.log.Info("raftnode: election: the successor did not take the campaign; campaigning", "group", s.group,
			"successor", succ.ID, "silent_leader", leader, "error", err)
		return nil
	}
	s.log.Info("raftnode: election: leader silent, the successor campaigns first", "group", s.group,
		"successor", succ.ID, "silent_leader", leader)
	s.held, s.decidedAt = true, time.Now()
	return errYield
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
		return fmt.Errorf("no answer within %v", s.wait)
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
