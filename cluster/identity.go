package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// The cluster id. A data dir records the cluster it belongs to (package
// server, identity.go); these decide which one: the id bootstrap forms, whether
// a cluster exists already, and the id a joining node takes from its peers.

// bootstrapClusterID is the id of a cluster formed by --bootstrap-expect from
// these members: every one of them computes the same value, so concurrent
// bootstraps agree, while a node that meets a cluster formed by others (its
// data dir wiped, or new) computes a different one and stays out of
// bootstrapping (see clusterExists).
func bootstrapClusterID(ms []membership.Member) string {
	var keys []string
	for _, m := range ms {
		keys = append(keys, m.ID+"/"+m.Incarnation)
	}
	slices.Sort(keys)
	sum := sha256.Sum256([]byte(strings.Join(keys, "\n")))
	for i := range sum {
		if sum[i] != 0 {
			break
		}
		if i == len(sum)-1 {
			sum[0] = 1
		}
	}
	return hex.EncodeToString(sum[:raftnode.IDLen/2])
}

// clusterExists reports whether a member other than self shows that a cluster
// other than the one bootstrap would form exists already: it gossips another
// cluster id, or an identity adopted from an earlier build (a cluster created
// before cluster ids). Such a node never bootstraps: it waits to be added.
func clusterExists(self string, ms []membership.Member, formed string) (bool, string) {
	for _, m := range ms {
		if m.ID == self || m.Status != membership.StatusAlive {
			continue
		}
		if m.ClusterID != "" && m.ClusterID != formed {
			return true, fmt.Sprintf("member %s belongs to cluster %s", m.ID, m.ClusterID)
		}
		if m.IncarnationAdopted {
			return true, fmt.Sprintf("member %s runs on a data dir of an earlier build", m.ID)
		}
	}
	return false, ""
}

// adoptClusterID gives a node that does not know its cluster id the one its
// alive peers gossip, once they agree on one: a node that joined an existing
// cluster belongs to it from then on, and gossip or raft from any other
// cluster is refused.
func (c *Controller) adoptClusterID() {
	if c.node.ClusterID() != "" || !c.node.Gossip() {
		return
	}
	cid := ""
	for _, m := range alive(c.node.Members()) {
		if m.ID == c.cfg.NodeID || m.ClusterID == "" {
			continue
		}
		if cid != "" && m.ClusterID != cid {
			return // peers disagree: wait (the merge guard keeps clusters apart)
		}
		cid = m.ClusterID
	}
	if cid != "" {
		c.node.SetClusterID(cid, "joined")
	}
}
