package raftnode

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft"
)

// gatedTransport is a group's NetworkTransport with a gate on the two ways
// this node can become a leader: asking for (pre-)votes, and accepting a
// leadership transfer (TimeoutNow). While Config.MayCampaign answers an
// error, outgoing (pre-)vote requests fail with it without leaving the node,
// so no election it starts can win, and an incoming TimeoutNow is answered
// with it, so the current leader's transfer fails at once and keeps its
// leadership (accepting it would make this node a candidate at a higher
// term, which deposes the leader even though this node cannot win).
// Incoming TimeoutNows from a peer other than the leader, and this node's
// pre-votes, also pass the successor tie-break (succession.go).
// Everything else (replication, votes for others, snapshots) passes through.
//
// Refusing to ask for votes is always safe for raft (a candidate that never
// wins changes no one's log); it only costs liveness while the gate is shut,
// which is its point: a node whose clock is not confirmed does not lead.
type gatedTransport struct {
	*raft.NetworkTransport
	gate func() error // the node's gate and the group's (groupGate)
	// group is the group's gate alone (Config.GroupMayCampaign), nil when
	// unset: a pre-vote it refuses is answered as refused without an error
	// (RequestPreVote).
	group func() error
	succ  *succession // nil: no successor tie-break (succession.go)

	consumer  chan raft.RPC
	done      chan struct{}
	closeOnce sync.Once
}

// appendFaultForTest, set by tests only, makes a node refuse the
// AppendEntries that carry entries (heartbeats still pass) while it answers
// true: its log falls behind while it keeps following the leader.
var appendFaultForTest atomic.Pointer[func(group int, self raft.ServerID) bool]

// ErrMayNotLead wraps Config.MayCampaign's refusal.
var ErrMayNotLead = errors.New("raftnode: this node may not lead now")

func newGatedTransport(inner *raft.NetworkTransport, gate, group func() error, succ *succession) *gatedTransport {
	t := &gatedTransport{NetworkTransport: inner, gate: gate, group: group, succ: succ, consumer: make(chan raft.RPC), done: make(chan struct{})}
	if succ != nil {
		succ.nudge = func(id raft.ServerID, addr raft.ServerAddress, req *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
			return retryStale(func() error { return inner.TimeoutNow(id, addr, req, resp) })
		}
		succ.campaign = t.campaign
	}
	go t.pump()
	return t
}

// errGated names the gate's answer in the caller's (raft's) logs. It must not
// contain "unexpected command": raft counts a pre-vote failing that way as
// granted (a peer of a build without pre-vote).
func (t *gatedTransport) check() error {
	if t.gate == nil {
		return nil
	}
	if err := t.gate(); err != nil {
		return fmt.Errorf("%w: %w", ErrMayNotLead, err)
	}
	return nil
}

func (t *gatedTransport) pump() {
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case <-t.done:
			return
		case rpc := <-in:
			switch req := rpc.Command.(type) {
			case *raft.AppendEntriesRequest:
				t.succ.heard(req.RPCHeader)
				if f := appendFaultForTest.Load(); f != nil && len(req.Entries) > 0 && t.succ != nil && (*f)(t.succ.group, t.succ.self) {
					rpc.Respond(nil, errors.New("raftnode: test: entries refused"))
					continue
				}
			case *raft.RequestVoteRequest:
				if t.succ.watching(req.ID) {
					rpc = t.watchVote(rpc, t.succ.refused)
				} else if t.succ != nil {
					// Not holding off (yet): remember a refusal for a
					// shorter log, in case this node then finds the
					// leader dead (leaderdown.go).
					from, last := raft.ServerID(req.ID), req.LastLogIndex
					rpc = t.watchVote(rpc, func() { t.succ.refusedBehind(from, last) })
				}
			case *raft.RequestPreVoteRequest:
				if t.succ.watching(req.ID) {
					rpc = t.watchVote(rpc, t.succ.refused)
				}
			case *raft.TimeoutNowRequest:
				err := t.check()
				if err == nil {
					err = t.succ.admit(req)
				}
				if err != nil {
					rpc.Respond(nil, err)
					continue
				}
			}
			select {
			case t.consumer <- rpc:
			case <-t.done:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		}
	}
}

// watchVote passes a (pre-)vote request on to raft and calls refused if
// raft refused it.
func (t *gatedTransport) watchVote(rpc raft.RPC, refused func()) raft.RPC {
	orig := rpc.RespChan
	ch := make(chan raft.RPCResponse, 1)
	rpc.RespChan = ch
	go func() {
		var resp raft.RPCResponse
		select {
		case resp = <-ch:
		case <-t.done:
			return
		}
		orig <- resp
		granted := false
		switch r := resp.Response.(type) {
		case *raft.RequestVoteResponse:
			granted = r.Granted
		case *raft.RequestPreVoteResponse:
			granted = r.Granted
		}
		if resp.Error == nil && !granted {
			refused()
		}
	}()
	return rpc
}

// campaign makes this node's raft start an election now, as a leader's
// TimeoutNow does (a follower becomes a candidate; a candidate carries on).
// The gate still decides whether its vote requests leave the node: false
// when it is shut (no election started).
func (t *gatedTransport) campaign() bool {
	if t.check() != nil {
		return false
	}
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(t.succ.self), Addr: []byte(t.LocalAddr())}
	rpc := raft.RPC{Command: &raft.TimeoutNowRequest{RPCHeader: header}, RespChan: make(chan raft.RPCResponse, 1)}
	select {
	case t.consumer <- rpc:
		return true
	case <-t.done:
		return false
	}
}

// Consumer is what raft reads incoming RPCs from.
func (t *gatedTransport) Consumer() <-chan raft.RPC { return t.consumer }

// SetHeartbeatHandler installs raft's fast path for heartbeats (they skip
// Consumer), noting their sender as the leader for the successor tie-break.
func (t *gatedTransport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	if cb == nil || t.succ == nil {
		t.NetworkTransport.SetHeartbeatHandler(cb)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok {
			t.succ.heard(req.RPCHeader)
		}
		cb(rpc)
	})
}

// RequestVote asks target for its vote, unless the gate is shut.
func (t *gatedTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := t.check(); err != nil {
		return err
	}
	return retryStale(func() error { return t.NetworkTransport.RequestVote(id, target, args, resp) })
}

// staleRetries bounds how often an election RPC is re-sent after finding
// its pooled connection ended (one more than the pool can hold per peer
// with the default TransportMaxPool).
const staleRetries = 4

// retryStale runs an election RPC (vote, pre-vote, TimeoutNow) again when
// it failed on a connection the peer had already ended. raft's transport
// keeps idle connections in a pool; those to a peer that has since
// restarted are dead, and the first RPC on each finds out (EOF, reset,
// broken pipe) and drops it. raft does not re-send a vote request within a
// round, so one stale connection cost a whole ElectionTimeout: seen as a
// failover of 500 ms instead of 50 when the candidate's pooled connection
// was to the survivor's previous process. Re-sending is safe: a voter
// answers a repeated request of the same candidate and term with the
// same vote, and a failed send delivered nothing (the connection was
// already closed).
func retryStale(rpc func() error) error {
	err := rpc()
	for i := 0; i < staleRetries && err != nil && connEnded(err); i++ {
		err = rpc()
	}
	return err
}

// connEnded reports whether an RPC failed because its connection had been
// closed by the peer before or while it was sent.
func connEnded(err error) bool {
	if peerEnded(err) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	// The transport's msgpack decoder may return io.EOF's text unwrapped.
	msg := err.Error()
	return msg == "EOF" || msg == "unexpected EOF"
}

// RequestPreVote asks target for its pre-vote, unless the gate is shut or
// this node yields the round to the group's successor (succession.go).
//
// A pre-vote the group's own gate refuses is answered here as refused, at
// the requested term (so raft neither raises its term nor logs an error),
// and never reaches target. That gate stays shut for a long time, not for
// a passing condition (a group a raise added, until the node restarts), so
// raft on this node would otherwise log an error per peer and round.
func (t *gatedTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.group != nil && t.group() != nil {
		resp.Term, resp.Granted = args.Term, false
		return nil
	}
	if err := t.check(); err != nil {
		return err
	}
	if t.succ.yield(args.RPCHeader) != nil {
		// Holding off for the successor: answered as a refused pre-vote at
		// the requested term rather than an error, which raft would log at
		// ERROR once per peer and round (succession.go logs the decision).
		resp.Term, resp.Granted = args.Term, false
		return nil
	}
	return retryStale(func() error { return t.NetworkTransport.RequestPreVote(id, target, args, resp) })
}

// Close stops the pump and the inner transport (idempotent).
func (t *gatedTransport) Close() error {
	t.closeOnce.Do(func() { close(t.done) })
	return t.NetworkTransport.Close()
}
