package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
)

// newNodeCmd groups the commands about one node of the cluster.
func newNodeCmd() *cobra.Command {
	var o adminOpts
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Operate on one node: drain its replicas before removing it",
	}
	o.register(cmd)
	var undo, wait bool
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every replica off NODE (and its leaderships) so it can be stopped for good; --undo makes it eligible again",
		Long: `drain decommissions NODE: placement stops choosing it, and each group's leader
moves the node's replica to another node (of the same zone when there is one)
through the learner path — add as non-voter, catch up, promote, remove the old
voter — one move at a time per leader, --move-interval apart. The mark is kept
in NODE's data dir, so a restart does not undo it. With --wait the command
returns once NODE holds no replica and leads no group; then stop it.

A zone whose only node is drained is placed on the other zones' nodes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd, func(ctx context.Context, adm api.AdminClient, _ api.TrackerClient) error {
				resp, err := retryCall(ctx, func(ctx context.Context) (*api.DrainNodeResponse, error) {
					return adm.DrainNode(ctx, &api.DrainNodeRequest{NodeId: args[0], Undo: undo})
				})
				if err != nil {
					return fmt.Errorf("drain %s: %w", args[0], err)
				}
				out := cmd.OutOrStdout()
				if !resp.Decommissioning {
					fmt.Fprintf(out, "%s: eligible for placement again; replicas move back to it as placement prefers\n", resp.NodeId)
					return nil
				}
				fmt.Fprintf(out, "%s: decommissioned; its replicas move to other nodes (tollgate status shows the moves left)\n", resp.NodeId)
				if !wait {
					return nil
				}
				return waitDrained(ctx, out, adm, resp.NodeId)
			})
		},
	}
	drain.Flags().BoolVar(&undo, "undo", false, "make the node eligible for placement again")
	drain.Flags().BoolVar(&wait, "wait", false, "wait (up to --timeout) until the node holds no replica and leads no group")
	cmd.AddCommand(drain)
	return cmd
}

// waitDrained polls Status until node is a voter or learner of no group (as
// the groups' leaders report) and leads none, printing progress on change.
func waitDrained(ctx context.Context, out io.Writer, adm api.AdminClient, node string) error {
	last := ""
	for {
		st, err := adm.Status(ctx, &api.StatusRequest{})
		if err == nil {
			held, known := drainLeft(st, node)
			msg := fmt.Sprintf("%s: %d replicas left (groups %s)", node, len(held), groupList(held))
			if known && len(held) == 0 {
				fmt.Fprintf(out, "%s: drained: no replica, no leadership; it can be stopped\n", node)
				return nil
			}
			if !known {
				msg = fmt.Sprintf("%s: waiting for every group's leader to report", node)
			}
			if msg != last {
				fmt.Fprintln(out, msg)
				last = msg
			}
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("drain %s: not finished before --timeout: %s (%w)", node, last, err)
		case <-time.After(time.Second):
		}
	}
}

// drainLeft returns the groups in which node is still a voter, a learner or
// the leader; known is false while some group's leader did not report.
func drainLeft(st *api.StatusResponse, node string) (held []uint32, known bool) {
	known = len(st.GetPlacement()) >= int(st.GetView().GetGroups()) // a raise adds groups beyond the view's count
	for _, gp := range st.GetPlacement() {
		if slices.Contains(gp.Voters, node) || slices.Contains(gp.Learners, node) {
			held = append(held, gp.Group)
		}
	}
	for _, m := range st.GetView().GetMembers() {
		if m.Id == node {
			for _, g := range m.GroupsLed {
				if !slices.Contains(held, g) {
					held = append(held, g)
				}
			}
		}
	}
	slices.Sort(held)
	return held, known
}

// printPlacement prints how far the groups are from placement: the replicas
// each node holds and the moves left.
func printPlacement(out io.Writer, st *api.StatusResponse) {
	ps := st.GetPlacement()
	if len(ps) == 0 {
		return
	}
	var moves []string
	for _, gp := range ps {
		var from, to []string
		for _, v := range gp.Voters {
			if !slices.Contains(gp.Target, v) {
				from = append(from, v)
			}
		}
		for _, t := range gp.Target {
			if !slices.Contains(gp.Voters, t) {
				to = append(to, t)
			}
		}
		if len(from) > 0 || len(to) > 0 || len(gp.Learners) > 0 {
			m := fmt.Sprintf("group %d: %s → %s", gp.Group, orDash(from), orDash(to))
			if len(gp.Learners) > 0 {
				m += " (catching up: " + strings.Join(gp.Learners, ",") + ")"
			}
			moves = append(moves, m)
		}
	}
	missing := int(st.GetView().GetGroups()) - len(ps)
	switch {
	case len(moves) == 0 && missing == 0:
		fmt.Fprintln(out, "\nplacement: every group's voters are where placement wants them")
	default:
		fmt.Fprintf(out, "\nplacement: %d groups to move", len(moves))
		if missing > 0 {
			fmt.Fprintf(out, " (%d groups' leaders did not report)", missing)
		}
		fmt.Fprintln(out)
		for _, m := range moves {
			fmt.Fprintln(out, "  "+m)
		}
	}
}

func orDash(ss []string) string {
	if len(ss) == 0 {
		return "-"
	}
	return strings.Join(ss, ",")
}

// replicaCounts returns, per node, the groups it is a voter of (per the
// groups' leaders).
func replicaCounts(st *api.StatusResponse) map[string]int {
	out := map[string]int{}
	for _, gp := range st.GetPlacement() {
		for _, v := range gp.Voters {
			out[v]++
		}
	}
	return out
}
