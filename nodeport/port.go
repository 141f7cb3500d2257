package nodeport

import (
	"context"

	"google.golang.org/grpc"
)

// Port is what a capability needs of the node it runs on.
type Port interface {
	// NodeID is this node's id (its raft server id).
	NodeID() string
	// Groups is the number of raft groups G.
	Groups() int
	// Leads reports whether this node decides for group g now: it is the
	// group's raft leader, its leader session has passed its barrier (so its
	// state holds every earlier term's entries, and the node's clock was
	// within bound when the session began), and the group is not halted here.
	// It is the only leadership predicate capabilities use.
	Leads(g int) bool
	// Hosts reports whether this node holds a replica of group g (is in its
	// raft configuration).
	Hosts(g int) bool
	// Propose appends an entry of an FSM module's registered type to group g,
	// which this node leads, after the cluster-version check, waits until it
	// applied and returns the module's result. Errors are gRPC statuses.
	Propose(ctx context.Context, g int, typ byte, payload []byte) (any, error)
	// Append is Propose without the wait: the entry is in raft's pipeline
	// when it returns, and wait returns the module's result.
	Append(g int, typ byte, payload []byte) (wait func(ctx context.Context) (any, error), err error)
	// LeaderConn returns a connection to group g's leader and the context to
	// call it with (Pool.Leader). It fails with Unavailable when no other node
	// is known to lead g or when ctx is a call another node forwarded here.
	LeaderConn(ctx context.Context, g int) (*grpc.ClientConn, context.Context, error)
	// PeerConn returns the node's connection to another node's gRPC address
	// (for calls that go to a given node rather than to a group's leader).
	// The node owns it: never close it.
	PeerConn(addr string) (*grpc.ClientConn, error)
}
