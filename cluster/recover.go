package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode"
)

// The offline recovery plan: a group whose voters are gone for good is
// rewritten, on a stopped survivor, so that its configuration is the
// survivors alone (package recovery opens the data dir and
// applies the plan with the group's real state machine).

// GroupRecovery is the plan for one group.
type GroupRecovery struct {
	raftnode.OfflineGroup // the group as it is on disk (Group, Configuration, …)
	New                   raft.Configuration
	// Skip says why the group is left alone ("" = it will be rewritten).
	Skip string
}

// PlanGroupRecovery works out the configuration recovery gives group og on
// node nodeID (data dir dataDir): the servers of keep (which include nodeID),
// each with the address it has in the old configuration, as voters. It
// refuses a group in which this node holds no state when the group was asked
// for (explicit), or whose configuration does not list this node (its data
// may be stale) or a server of keep. A group without state here that was not
// asked for, or whose configuration already is the new one, is skipped.
func PlanGroupRecovery(og raftnode.OfflineGroup, nodeID, dataDir string, keep []string, explicit bool) (GroupRecovery, error) {
	g := og.Group
	gr := GroupRecovery{OfflineGroup: og}
	switch {
	case !og.HasState && explicit:
		return gr, fmt.Errorf("group %d: %s holds no raft state for it: nothing to recover from here", g, dataDir)
	case !og.HasState:
		gr.Skip = "no raft state on this node"
		return gr, nil
	}
	byID := map[raft.ServerID]raft.Server{}
	for _, s := range og.Configuration.Servers {
		byID[s.ID] = s
	}
	if _, ok := byID[raft.ServerID(nodeID)]; !ok {
		return gr, fmt.Errorf("group %d: %s is not in the group's configuration (%s): its data for the group may be stale; recover the group on a node that is",
			g, nodeID, FormatConfiguration(og.Configuration))
	}
	var errs []error
	for _, id := range keep {
		s, ok := byID[raft.ServerID(id)]
		if !ok {
			errs = append(errs, fmt.Errorf("group %d: --voters names %s, which is not in the group's configuration (%s)", g, id, FormatConfiguration(og.Configuration)))
			continue
		}
		s.Suffrage = raft.Voter
		gr.New.Servers = append(gr.New.Servers, s)
	}
	if err := errors.Join(errs...); err != nil {
		return gr, err
	}
	if sameConfiguration(og.Configuration, gr.New) {
		gr.Skip = "its configuration already is the new one"
	}
	return gr, nil
}

// FormatConfiguration prints a raft configuration as "id address suffrage"
// entries, comma-separated.
func FormatConfiguration(c raft.Configuration) string {
	if len(c.Servers) == 0 {
		return "(empty)"
	}
	var parts []string
	for _, s := range c.Servers {
		parts = append(parts, fmt.Sprintf("%s %s %s", s.ID, s.Address, s.Suffrage))
	}
	return strings.Join(parts, ", ")
}

func sameConfiguration(a, b raft.Configuration) bool {
	if len(a.Servers) != len(b.Servers) {
		return false
	}
	for i := range a.Servers {
		if a.Servers[i] != b.Servers[i] {
			return false
		}
	}
	return true
}
