package clockbound

import (
	"errors"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/membership"
)

// The port: everything the clock reads from or does to the node. The node
// (package server, clockport.go) implements it over its raft host, serf,
// peer pool and leader sessions. Nothing else crosses: the clock holds no
// raft host, no serf and no tracker of its own.

// Raft is one group's raft instance as the clock uses it: its state and
// voters, and leadership hand-off. *raft.Raft satisfies it.
type Raft interface {
	State() raft.RaftState
	GetConfiguration() raft.ConfigurationFuture
	LeadershipTransfer() raft.Future
	LeadershipTransferToServer(id raft.ServerID, address raft.ServerAddress) raft.Future
}

// Node is the node the clock runs on. Raft and the leader-session calls are
// made only after Clock.Attach.
type Node interface {
	// Raft is group g's raft on this node (nil when the group has none,
	// e.g. one whose clock AddGroup added before its raft was created).
	// It is asked for every g below Clock.Groups().
	Raft(g int) Raft
	// Members are the members that proved they are nodes of this cluster,
	// any status; this node alone when it runs without gossip. Alive ones
	// are probed; any not departed count before a configuration is known.
	Members() []membership.Member
	// Conn is the node's connection to the peer at grpcAddr, on which
	// Clock.Now is called. ErrNotReady: the node cannot call peers yet
	// (nothing is recorded for that peer).
	Conn(grpcAddr string) (grpc.ClientConnInterface, error)
	// LeaderSession reports whether this node runs group g's leader
	// session.
	LeaderSession(g int) bool
	// StopLeaderSession ends group g's leader session (clock not
	// confirmed).
	StopLeaderSession(g int)
	// ResumeLeaderSession asks, without blocking, for group g's leader
	// session to start again if the node may lead g otherwise (raft made
	// it leader while its clock was not confirmed).
	ResumeLeaderSession(g int)
	// Go runs f on a goroutine the node waits for when it stops.
	Go(f func())
}

// ErrNotReady is what Node.Conn returns while the node cannot call its
// peers yet.
var ErrNotReady = errors.New("clockbound: the node cannot call its peers yet")
