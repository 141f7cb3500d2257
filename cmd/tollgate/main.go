// Command tollgate is the single Tollgate binary: the server and its tools.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/version"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "tollgate",
		Short:         "Raft-replicated active-series limits and usage for ingestion pipelines",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(newServerCmd(), newTrackCmd(), newBenchCmd(), newStatusCmd(), newRaftCmd(), newSnapshotCmd())
	root.AddCommand(newTenantCmd(), newRateBenchCmd())
	root.AddCommand(newTLSCmd(), newHealthCmd())
	root.AddCommand(newLimitsCmd())
	root.AddCommand(newUsageCmd())
	root.AddCommand(newNodeCmd(), newGroupsCmd())
	root.AddCommand(newScaleBenchCmd())
	root.AddCommand(newGatewayCmd(), newRWBenchCmd(), newRWSinkCmd())
	root.AddCommand(newEnvoyBenchCmd())
	return root
}
