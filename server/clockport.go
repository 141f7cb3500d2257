package server

import (
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/clockbound"
	"github.com/tollgate-io/tollgate/membership"
)

// clockPort is the node as package clockbound sees it: the groups' rafts,
// the trusted members, the peer pool for Clock.Now and the leader sessions.
// The clock calls Raft and the session methods only after Attach (once
// s.host and the trackers exist).
type clockPort struct{ s *Server }

func newClock(s *Server) (*clockbound.Clock, error) {
	return clockbound.New(clockbound.Config{NodeID: s.cfg.Node.ID, Groups: s.cfg.Layout.Groups, Bound: s.cfg.Clock.MaxOffset,
		BootstrapExpect: s.cfg.Cluster.BootstrapExpect, Clock: s.cfg.Clock.Now, Logger: s.log, Registerer: s.metrics.reg,
		Node: clockPort{s: s}})
}

func (p clockPort) Raft(g int) clockbound.Raft {
	if g >= p.s.host.Groups() {
		return nil // a group being added has its clock before its raft (groups.go)
	}
	if r := p.s.host.Raft(g); r != nil {
		return r
	}
	return nil // no typed nil: the clock skips a group without a raft
}

func (p clockPort) Members() []membership.Member { return p.s.memberList() }

func (p clockPort) Conn(addr string) (grpc.ClientConnInterface, error) {
	if p.s.admin == nil {
		return nil, clockbound.ErrNotReady
	}
	return p.s.admin.conn(addr)
}

func (p clockPort) LeaderSession(g int) bool { return p.s.servesGroup(g) && p.s.trackers[g].leading() }
func (p clockPort) StopLeaderSession(g int) {
	if p.s.servesGroup(g) { // a group being added has no session yet (groups.go)
		p.s.trackers[g].setLeader(false)
	}
}

// ResumeLeaderSession queues a recheck of group g's leadership (never
// blocking the clock's loop) if nothing but the clock kept it from leading.
func (p clockPort) ResumeLeaderSession(g int) {
	if !p.s.mayLead(g) {
		return
	}
	select {
	case p.s.leaderEvents <- leaderEvent{group: g, leader: true, recheck: true}:
	default:
	}
}

func (p clockPort) Go(f func()) {
	p.s.wg.Add(1)
	go func() { defer p.s.wg.Done(); f() }()
}
