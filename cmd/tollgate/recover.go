package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/cluster"
	"github.com/tollgate-io/tollgate/recovery"
)

// newRaftRecoverCmd is `tollgate raft recover`: offline outage recovery of
// groups that lost their quorum for good.
func newRaftRecoverCmd() *cobra.Command {
	var (
		dataDir, nodeID string
		group           int
		all, force      bool
		voters          []string
	)
	cmd := &cobra.Command{
		Use:   "recover --data-dir D --node-id ID (--group G | --all-groups) [--voters ID,…] [--force]",
		Short: "OFFLINE: make the surviving nodes the only voters of groups that lost their quorum for good",
		Long: `Outage recovery, for a group that can never elect a leader again because more
than a quorum of its voters are gone for good (their disks are lost). It runs on
a STOPPED surviving node, on its data dir, and rewrites the group's raft state
so that its configuration is the survivors alone (by default this node alone),
keeping this node's data: the newest snapshot plus every entry of its log,
including entries it logged but never saw committed. Started again, the node
elects itself leader; then add new nodes as usual (start them with --join).

Recover only groups that have no leader (NO LEADER in ` + "`tollgate status`" + `): a group
that still has a quorum elsewhere would split into two histories. --all-groups
is for a node whose every group lost its quorum.

Without --force it prints, per group, the configuration on disk and the one it
would write, and changes nothing.

Use it only when the lost voters cannot come back. Series acknowledged after
this node's last log entry are lost. Never start a removed voter again on its
old data: two of them together still hold a quorum of the old configuration and
would run a second, diverging copy of the group. Wipe them and join them as new
nodes. With several survivors, stop all of them
and run the same command with the same --voters on each before starting any.
Copy the data dir first if you may want to undo it.`,
		Example: `  tollgate raft recover --data-dir /var/lib/tollgate --node-id a1 --all-groups           # shows the plan
  tollgate raft recover --data-dir /var/lib/tollgate --node-id a1 --all-groups --force   # does it`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case dataDir == "" || nodeID == "":
				return errors.New("raft recover: --data-dir and --node-id (the stopped node's) are required")
			case group < 0 && !all:
				return errors.New("raft recover: give --group G or --all-groups")
			case group >= 0 && all:
				return errors.New("raft recover: give --group G or --all-groups, not both")
			}
			opts := recovery.Options{DataDir: dataDir, NodeID: nodeID, Voters: voters}
			if group >= 0 {
				opts.Groups = []int{group}
			}
			plan, err := recovery.Prepare(opts)
			if err != nil {
				return err
			}
			defer plan.Close()
			out := cmd.OutOrStdout()
			todo := printRecoverPlan(out, plan)
			if todo == 0 {
				fmt.Fprintln(out, "\nnothing to do: no group needs recovery on this data dir")
				return nil
			}
			if !force {
				return fmt.Errorf("refusing without --force: this rewrites the raft state of %d group(s) of %s (see above); nothing was changed", todo, dataDir)
			}
			fmt.Fprintln(out)
			done, err := plan.Apply()
			for _, r := range done {
				fmt.Fprintf(out, "group %d: RECOVERED: %d series of %d tenants kept (applied index %d); voters now: %s\n",
					r.Group, r.Series, r.Tenants, r.AppliedIndex, newVoters(plan, r.Group))
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "\nnext: start %s again with its usual flags; it leads the recovered groups alone. Then bring up new nodes with --join; "+
				"the group leaders add them where a zone has no voter (or use `tollgate raft add-voter`). "+
				"Never start a lost node again on its old data dir: wipe it and join it as a new node.\n", nodeID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "the stopped node's data dir")
	f.StringVar(&nodeID, "node-id", "", "the stopped node's node id")
	f.IntVar(&group, "group", -1, "the group to recover")
	f.BoolVar(&all, "all-groups", false, "every group this node holds state for")
	f.StringSliceVar(&voters, "voters", nil, "ids of the surviving servers that stay voters, all from the old configuration (default: this node alone)")
	f.BoolVar(&force, "force", false, "rewrite the raft state (without it: print the plan only)")
	return cmd
}

// printRecoverPlan prints the plan loudly and returns how many groups it
// rewrites.
func printRecoverPlan(out io.Writer, p *recovery.Plan) int {
	todo := 0
	fmt.Fprintf(out, "OFFLINE RAFT RECOVERY of node %s, data dir %s (partitions=%d groups=%d shards=%d)\n",
		p.NodeID(), p.DataDir(), p.Partitions, p.Groups, p.Shards)
	for _, g := range p.Plans {
		fmt.Fprintf(out, "\ngroup %d:", g.Group)
		if g.Skip != "" {
			fmt.Fprintf(out, " skipped: %s\n", g.Skip)
			continue
		}
		todo++
		fmt.Fprintln(out)
		fmt.Fprintf(out, "  on disk:            log %d..%d (last term %d), current term %d, newest snapshot at index %d\n",
			g.FirstIndex, g.LastIndex, g.LastTerm, g.CurrentTerm, g.SnapshotIndex)
		fmt.Fprintf(out, "  old configuration:  %s (written at index %d)\n", cluster.FormatConfiguration(g.Configuration), g.ConfigurationIndex)
		fmt.Fprintf(out, "  new configuration:  %s\n", cluster.FormatConfiguration(g.New))
		var gone []string
		for _, s := range g.Configuration.Servers {
			kept := false
			for _, n := range g.New.Servers {
				kept = kept || n.ID == s.ID
			}
			if !kept {
				gone = append(gone, string(s.ID))
			}
		}
		if len(gone) > 0 {
			fmt.Fprintf(out, "  removed:            %s (must never start again with their current data)\n", strings.Join(gone, ", "))
		}
	}
	if todo > 0 {
		fmt.Fprintf(out, "\nWARNING: every entry in this node's log becomes committed, including any it logged but never saw\n"+
			"committed; series acknowledged by the lost voters after this node's last entry are gone. Do this only when\n"+
			"the removed servers are lost for good.\n")
	}
	return todo
}

func newVoters(p *recovery.Plan, g int) string {
	for _, gr := range p.Plans {
		if gr.Group == g {
			return cluster.FormatConfiguration(gr.New)
		}
	}
	return "?"
}
