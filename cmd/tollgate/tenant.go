package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
)

func newTenantCmd() *cobra.Command {
	var o adminOpts
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Tenant operator commands",
	}
	o.register(cmd)
	var dryRun bool
	drop := &cobra.Command{
		Use:   "drop TENANT",
		Short: "Remove every series of a tenant in every group, freeing its usage",
		Long: `Drops a tenant's series in every group (a drop-tenant raft entry on each
group's leader; any node forwards the call) and sets its usage to 0: the series
it sends afterwards count as new. Series acknowledged while the command runs may
or may not survive it.

It needs cluster version 2 on every node of every group. During a rolling
upgrade it fails with FailedPrecondition naming the nodes still on an older
version: finish the upgrade first. Repeating it is safe.

--dry-run changes nothing: it prints the series the drop would remove per
group, as the answering node's replicas hold them now (a tenant name the
cluster does not know, usually a typo, is an error).`,
		Example: `  tollgate tenant drop team-a --dry-run   # what would go
  tollgate tenant drop team-a`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dryRun {
				return dropDryRun(cmd, &o, args[0])
			}
			return o.run(cmd, func(ctx context.Context, adm api.AdminClient, _ api.TrackerClient) error {
				resp, err := adm.DropTenant(ctx, &api.DropTenantRequest{Tenant: args[0]})
				if err != nil {
					return fmt.Errorf("tenant drop %s: %w", args[0], err)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "GROUP\tREMOVED\tINDEX\tLEADER")
				for _, g := range resp.Groups {
					fmt.Fprintf(w, "%d\t%d\t%d\t%s\n", g.Group, g.Removed, g.Index, g.LeaderId)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "tenant %s dropped: %d series removed\n", resp.Tenant, resp.Removed)
				return err
			})
		},
	}
	drop.Flags().BoolVar(&dryRun, "dry-run", false, "change nothing: print the series per group the drop would remove")
	cmd.AddCommand(drop)
	return cmd
}

// dropDryRun prints what `tenant drop` would remove: the tenant's series per
// group on the answering node's replicas (Shares.TenantShares, admin).
func dropDryRun(cmd *cobra.Command, o *adminOpts, tenant string) error {
	resp, err := tenantShares(cmd, o, tenant)
	if err != nil {
		return fmt.Errorf("tenant drop %s --dry-run: %w", tenant, err)
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tWOULD REMOVE")
	var total uint64
	for _, g := range resp.Groups {
		fmt.Fprintf(w, "%d\t%d\n", g.Group, g.Series)
		total += uint64(g.Series)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "dry run: tenant %s: %d series would be removed (as %s's replicas hold them now); nothing was changed\n", tenant, total, resp.NodeId)
	return err
}
