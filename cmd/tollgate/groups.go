package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
)

// newGroupsCmd groups the commands about the cluster's raft groups.
func newGroupsCmd() *cobra.Command {
	var o adminOpts
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Operate on the cluster's raft groups: raise their count online",
	}
	o.register(cmd)
	var to int
	raise := &cobra.Command{
		Use:   "raise --to N",
		Short: "Raise the cluster's group count to N: the new groups are created empty on every node",
		Long: `raise adds groups G..N-1 to a running cluster of G groups (G < N ≤ partitions).
Group 0's leader appends a layout-raise entry (it needs cluster version 6 on
every node: finish a rolling upgrade first) that keeps every partition's owner
and names each new group's voters (one per zone, by placement); every node then
creates the new groups, empty, and their voters bootstrap them. The count
cannot be lowered. Re-running the command at the same count changes nothing
and shows the new groups' state.

Each node creates the new groups' state in place and serves them within
seconds; no restart is needed (a node of an earlier build leads them from its
next restart, and tollgate status names it). Once a new group has a leader,
group 0's leader moves partitions to it, one at a time and under load: each old group hands the upper half of its range to a new group
(series and their share move together; clients follow without an error).
tollgate status shows the count, each new group's leader, and the moves'
progress; re-running the command resumes nothing it needs to: the moves
continue on their own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to < 1 {
				return fmt.Errorf("groups raise: --to is required (the new group count, above the current one)")
			}
			return o.run(cmd, func(ctx context.Context, adm api.AdminClient, _ api.TrackerClient) error {
				resp, err := retryCall(ctx, func(ctx context.Context) (*api.RaiseGroupsResponse, error) {
					return adm.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: uint32(to)})
				})
				if err != nil {
					return fmt.Errorf("groups raise --to %d: %w", to, err)
				}
				out := cmd.OutOrStdout()
				if resp.Changed {
					fmt.Fprintf(out, "group count raised from %d to %d (layout epoch %d): groups %d..%d are being created, empty\n", resp.From, resp.Groups, resp.Epoch, resp.From, resp.Groups-1)
				} else {
					fmt.Fprintf(out, "the cluster already runs %d groups: nothing changed\n", resp.Groups)
				}
				st, err := adm.Status(ctx, &api.StatusRequest{})
				if err == nil {
					printNewGroups(out, st)
					printMoves(out, st)
				}
				return nil
			})
		},
	}
	raise.Flags().IntVar(&to, "to", 0, "the new group count (above the current one, at most the partition count)")
	cmd.AddCommand(raise)
	return cmd
}

// newGroupState is one group beyond the cluster view's count (added by a
// raise) as the nodes report it.
type newGroupState struct {
	group  uint32
	leader string
	voters []string
	nodes  int // nodes that run the group's raft
}

// newGroups collects the groups the nodes run beyond the view's count.
func newGroups(st *api.StatusResponse) []newGroupState {
	base := st.GetView().GetGroups()
	byGroup := map[uint32]*newGroupState{}
	for _, n := range st.GetNodes() {
		for _, gs := range n.GetGroups() {
			if gs.Group < base {
				continue
			}
			ng := byGroup[gs.Group]
			if ng == nil {
				ng = &newGroupState{group: gs.Group}
				byGroup[gs.Group] = ng
			}
			ng.nodes++
			if gs.RaftState == "Leader" {
				ng.leader, ng.voters = n.NodeId, gs.Voters
			}
		}
	}
	out := make([]newGroupState, 0, len(byGroup))
	for _, ng := range byGroup {
		out = append(out, *ng)
	}
	slices.SortFunc(out, func(a, b newGroupState) int { return int(a.group) - int(b.group) })
	return out
}

// printNewGroups prints the groups a raise added: each one's leader and
// voters, or that it has none yet.
func printNewGroups(out io.Writer, st *api.StatusResponse) {
	ngs := newGroups(st)
	if len(ngs) == 0 {
		return
	}
	ready := 0
	for _, ng := range ngs {
		if ng.leader != "" {
			ready++
		}
	}
	fmt.Fprintf(out, "\ngroups added by a raise: %d (%d with a leader)\n", len(ngs), ready)
	for _, ng := range ngs {
		if ng.leader == "" {
			fmt.Fprintf(out, "  group %d: NO LEADER yet (%d nodes run it; its voters elect one once they serve it)\n", ng.group, ng.nodes)
			continue
		}
		fmt.Fprintf(out, "  group %d: leader %s, voters %s\n", ng.group, ng.leader, strings.Join(ng.voters, ","))
	}
	if ids := restartNeeded(st); len(ids) > 0 {
		fmt.Fprintf(out, "  not leading the raised groups yet: %s (a node serves each group it creates within seconds; one that stays listed runs an earlier build and leads them from its next restart)\n", strings.Join(ids, ", "))
	}
}

// restartNeeded lists the alive members that gossip a bound on the groups
// they may lead below the cluster's count (the layout table's, or else the
// groups the nodes run): still creating a raised group's state, or running
// an earlier build that leads the new groups from its next start.
func restartNeeded(st *api.StatusResponse) []string {
	groups := st.GetView().GetLayout().GetGroups()
	for _, n := range st.GetNodes() {
		for _, gs := range n.GetGroups() {
			groups = max(groups, gs.Group+1)
		}
	}
	var ids []string
	for _, m := range st.GetView().GetMembers() {
		if m.Status == "alive" && m.LeadGroups > 0 && m.LeadGroups < groups {
			ids = append(ids, fmt.Sprintf("%s (groups 0-%d of %d)", m.Id, m.LeadGroups-1, groups))
		}
	}
	return ids
}

// printMoves prints the partition moves' progress, as group 0's leader
// reports it.
func printMoves(out io.Writer, st *api.StatusResponse) {
	pm := st.GetPartitionMoves()
	if pm == nil || pm.GetGroups() == 0 {
		return
	}
	if pm.GetPending() == 0 {
		fmt.Fprintf(out, "partition moves: none pending (every partition at its owner for %d groups)\n", pm.GetGroups())
		return
	}
	fmt.Fprintf(out, "partition moves: %d partitions to move for %d groups", pm.GetPending(), pm.GetGroups())
	if c := pm.GetCurrent(); c != "" {
		fmt.Fprintf(out, "; now %s", c)
	}
	fmt.Fprintln(out)
	if e := pm.GetError(); e != "" {
		fmt.Fprintf(out, "  waiting: %s\n", e)
	}
}

// raisedNote is the status line's note on a raised group count: the view's
// count is the one the cluster was created with, its layout table the
// current one.
func raisedNote(v *api.ClusterView) string {
	n := v.GetLayout().GetGroups()
	if n <= v.GetGroups() {
		return ""
	}
	return fmt.Sprintf(", raised to %d", n)
}
