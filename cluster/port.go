package cluster

import (
	"context"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// The port: everything the controller reads from or does to the node. The
// node (package server, clusterport.go) implements it over its raft host,
// serf and peer pool; the tests here implement it over a fake raft. Nothing
// else crosses: the controller holds no raft, no serf and no gRPC client.

// Raft is one group's raft instance, as the controller uses it: its
// configuration calls, its state and its indexes. *raft.Raft satisfies it.
type Raft interface {
	// State is this replica's raft state; raft.Leader is what "led here"
	// means for every cluster duty (raft's word, not the leader session's:
	// a leader whose session is still at its barrier repairs placement too).
	State() raft.RaftState
	GetConfiguration() raft.ConfigurationFuture
	AddNonvoter(id raft.ServerID, address raft.ServerAddress, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	AddVoter(id raft.ServerID, address raft.ServerAddress, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	RemoveServer(id raft.ServerID, prevIndex uint64, timeout time.Duration) raft.IndexFuture
	LeadershipTransfer() raft.Future
	LeadershipTransferToServer(id raft.ServerID, address raft.ServerAddress) raft.Future
	// LastIndex and CommitIndex measure how far a learner or a new
	// incarnation trails this leader.
	LastIndex() uint64
	CommitIndex() uint64
	// LeaderWithID is the leader this replica knows ("" when none): a
	// replica that knows none for long may have been removed (stale.go).
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
}

// Node is the node the controller runs on.
type Node interface {
	// Raft is group g's raft on this node.
	Raft(g int) Raft
	// Members are the members that proved they are nodes of this cluster,
	// any status; this node alone when it runs without gossip.
	Members() []membership.Member
	// Gossip reports whether the node runs serf (false: a single node,
	// which has nobody to place, move or replace).
	Gossip() bool
	// PeerGroups asks the node at grpcAddr, on this node's own account
	// (node credential), for its id, raft address and replicas
	// (Admin.NodeGroups): the probe that tells a learner's progress.
	PeerGroups(ctx context.Context, grpcAddr string) (*api.NodeGroupsResponse, error)
	// ProbeRaft checks that addr answers group g's raft at all.
	ProbeRaft(g int, addr raft.ServerAddress, timeout time.Duration) error
	// GroupHasState and BootstrapGroup are bootstrap's: whether this node
	// holds raft state for group g, and forming g with servers.
	GroupHasState(g int) (bool, error)
	BootstrapGroup(g int, servers []raft.Server) error
	// ClusterID is the cluster this data dir belongs to ("" not yet);
	// SetClusterID records it for good (data dir, raft transport, gossip).
	ClusterID() string
	SetClusterID(cid, how string)
	// MayLead is "" when member id may lead as far as clocks go, else why
	// not (its clock is out of bound).
	MayLead(id string) string
}
