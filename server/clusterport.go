package server

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
)

// clusterPort is the node as package cluster's controller sees it
// (cluster/port.go): raft per group from the host, members from serf
// (trusted ones only, nodeauth.go), peers' replicas through the node's peer
// pool, and the cluster id in the data dir.
type clusterPort struct{ s *Server }

// newController builds the node's cluster controller (cluster.Controller).
func newController(s *Server) *cluster.Controller {
	return cluster.New(cluster.Config{
		NodeID: s.cfg.Node.ID, Zone: s.cfg.Node.Zone, Groups: s.cfg.Layout.Groups, Replicas: s.cfg.Cluster.Replicas,
		RaftGroups:      func() int { return s.host.Groups() }, // groups.go: a raise adds groups
		BootstrapExpect: s.cfg.Cluster.BootstrapExpect, DisableAutoPlace: s.cfg.Cluster.DisableAutoPlace, MoveInterval: s.cfg.Cluster.MoveInterval,
		RaftError: raftStatus, // errors.go
		Log:       s.log, Misplaced: s.metrics.misplaced, Moves: s.metrics.moves,
		Closing: s.closing, WG: &s.wg,
	}, clusterPort{s})
}

func (p clusterPort) Raft(g int) cluster.Raft           { return p.s.host.Raft(g) }
func (p clusterPort) Members() []membership.Member      { return p.s.memberList() } // cluster.go
func (p clusterPort) Gossip() bool                      { return p.s.members != nil }
func (p clusterPort) GroupHasState(g int) (bool, error) { return p.s.host.GroupHasState(g) }
func (p clusterPort) ClusterID() string                 { return p.s.ident.ClusterID() }
func (p clusterPort) SetClusterID(cid, how string)      { p.s.setClusterID(cid, how) }      // identity.go
func (p clusterPort) MayLead(id string) string          { return p.s.clock.PeerReason(id) } // clockbound

func (p clusterPort) BootstrapGroup(g int, servers []raft.Server) error {
	return p.s.host.BootstrapGroup(g, servers)
}

func (p clusterPort) ProbeRaft(g int, addr raft.ServerAddress, timeout time.Duration) error {
	return p.s.host.Probe(g, addr, timeout)
}

// PeerGroups asks the node at grpcAddr for its Admin.NodeGroups on this
// node's own account: with its node credential (nodeport.Pool), sent only
// once the address proved it is a node of this cluster; a caller's
// credentials stay behind (forward.Own).
func (p clusterPort) PeerGroups(ctx context.Context, grpcAddr string) (*api.NodeGroupsResponse, error) {
	if p.s.admin == nil {
		return nil, errors.New("the node's admin service is not running yet")
	}
	c, err := p.s.admin.client(grpcAddr)
	if err != nil {
		return nil, err
	}
	return c.NodeGroups(forward.Own(ctx), &api.NodeGroupsRequest{})
}
