package cluster

import (
	"strings"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// Quorum checks before a removal. An operator's remove-server is refused
// when the voters left would not have a quorum of running members
// (RemovalKeepsQuorum, here); an automatic removal of an earlier incarnation
// waits until the voters left include a quorum that is up to date
// (quorumUpToDateWithout, incarnation.go); a replica move removes a voter
// only while the group has more than its replicas (runMove, move.go).

// RemovalKeepsQuorum refuses to remove a voter when the voters left would
// not have a quorum of running members (this leader, and alive members by
// serf): removing a healthy voter while another is down would stop the group.
func (c *Controller) RemovalKeepsQuorum(g int, peers []*api.Peer, id string) error {
	alive := map[string]bool{c.cfg.NodeID: true}
	for _, m := range c.node.Members() {
		if m.Status == membership.StatusAlive {
			alive[m.ID] = true
		}
	}
	var left, up int
	var down []string
	for _, p := range peers {
		if p.Suffrage != raft.Voter.String() || p.Id == id {
			continue
		}
		left++
		if alive[p.Id] {
			up++
		} else {
			down = append(down, p.Id)
		}
	}
	if need := left/2 + 1; up < need {
		return status.Errorf(codes.FailedPrecondition,
			"remove-server: removing %q would leave group %d %d voters of which only %d run (down: %s); it needs %d to commit anything: bring the down voters back or remove them first (--force to remove anyway); nothing was changed",
			id, g, left, up, strings.Join(down, ", "), need)
	}
	return nil
}
