package raftnode

import (
	"errors"
	"fmt"
	"sync"

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
// Everything else (replication, votes for others, snapshots) passes through.
//
// Refusing to ask for votes is always safe for raft (a candidate that never
// wins changes no one's log); it only costs liveness while the gate is shut,
// which is its point: a node whose clock is not confirmed does not lead.
type gatedTransport struct {
	*raft.NetworkTransport
	gate func() error

	consumer  chan raft.RPC
	done      chan struct{}
	closeOnce sync.Once
}

// ErrMayNotLead wraps Config.MayCampaign's refusal.
var ErrMayNotLead = errors.New("raftnode: this node may not lead now")

func newGatedTransport(inner *raft.NetworkTransport, gate func() error) *gatedTransport {
	t := &gatedTransport{NetworkTransport: inner, gate: gate, consumer: make(chan raft.RPC), done: make(chan struct{})}
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
			if _, ok := rpc.Command.(*raft.TimeoutNowRequest); ok {
				if err := t.check(); err != nil {
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

// Consumer is what raft reads incoming RPCs from.
func (t *gatedTransport) Consumer() <-chan raft.RPC { return t.consumer }

// RequestVote asks target for its vote, unless the gate is shut.
func (t *gatedTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := t.check(); err != nil {
		return err
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote asks target for its pre-vote, unless the gate is shut.
func (t *gatedTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if err := t.check(); err != nil {
		return err
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}

// Close stops the pump and the inner transport (idempotent).
func (t *gatedTransport) Close() error {
	t.closeOnce.Do(func() { close(t.done) })
	return t.NetworkTransport.Close()
}
