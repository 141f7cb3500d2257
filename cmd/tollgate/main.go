// Command tollgate is the single Tollgate binary: the server and its tools.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
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
	}
	root.AddCommand(newServerCmd(), newTrackCmd(), newBenchCmd(), newStatusCmd(), newRaftCmd(), newSnapshotCmd())
	root.AddCommand(newTenantCmd())
	return root
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}
