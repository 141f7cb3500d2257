package cluster

import (
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/membership"
)

// Rolling upgrades: which servers of a group can be counted on to apply an
// entry of a given cluster version (package server's versions.go gates
// entries on it).

// VersionLag lists the servers that cannot be counted on to apply an entry of
// cluster version `version`: self when selfVersion is below it, a server the
// member list advertises below it, and a server missing from the member list.
//
// A member that is down (failed, leaving, left) counts with the version it
// last advertised: serf keeps a failed member, tags included, until the
// reconnect timeout (24 h, membership.New) and a member that left until the
// tombstone timeout, so its last "ver" tag is what its build supported. Only
// a downgrade could bring it back below that, and downgrades are unsupported:
// such a replica halts the group on the first entry it cannot apply, which
// /readyz and tollgate_group_halted report — the same outcome as adding a
// voter with an older build to a group that already uses newer entry types.
// Treating a down voter as "unknown" instead blocked every newer entry type
// (runtime config, share moves, metering) for the whole outage of one node.
//
// A server absent from the member list (reaped, or not rejoined since a
// restart: serf's snapshot keeps addresses, not tags) counts with the version
// this node's peers record holds for it (recorded, 0 for none): by the same
// argument, it is what its build supported when last seen. Without one its
// version is unknown and it lags.
func VersionLag(servers []raft.Server, members []membership.Member, recorded func(id string) int, self string, selfVersion, version int) (lagging []string) {
	lagging, _ = VersionLagUnknown(servers, members, recorded, self, selfVersion, version)
	return lagging
}

// VersionLagUnknown is VersionLag, also counting how many of the lagging
// servers lag only because their version is not known (absent from the
// member list): a leader that has just restarted sees its peers that way
// until it rejoins gossip, which is no reason to treat them as older builds.
func VersionLagUnknown(servers []raft.Server, members []membership.Member, recorded func(id string) int, self string, selfVersion, version int) (lagging []string, unknown int) {
	byID := make(map[string]membership.Member, len(members))
	for _, m := range members {
		byID[m.ID] = m
	}
	for _, srv := range servers {
		id := string(srv.ID)
		if id == self {
			if selfVersion < version {
				lagging = append(lagging, fmt.Sprintf("%s supports cluster version %d", id, selfVersion))
			}
			continue
		}
		m, known := byID[id]
		switch {
		case !known && recorded != nil && recorded(id) >= version:
		case !known:
			lagging = append(lagging, fmt.Sprintf("%s is not in the member list (cluster version unknown)", id))
			unknown++
		case m.ClusterVersion >= version:
		case m.Status == membership.StatusAlive:
			lagging = append(lagging, fmt.Sprintf("%s supports cluster version %d", id, m.ClusterVersion))
		default:
			lagging = append(lagging, fmt.Sprintf("%s is %s and last advertised cluster version %d", id, m.Status, m.ClusterVersion))
		}
	}
	return lagging, unknown
}
