package main

import (
	"context"
	"fmt"
	"maps"
	"os"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/service/runtimecfg"
)

func newLimitsApplyEnvoyCmd() *cobra.Command {
	var o adminOpts
	var files, remove []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply-envoy -f ratelimit.yaml [-f more.yaml] [--delete DOMAIN]",
		Short: "Set the Envoy rate limit service's configuration of domains, from envoyproxy/ratelimit YAML files",
		Long: `Each file is one envoyproxy/ratelimit configuration (domain, descriptors); it replaces that
domain's configuration in the replicated runtime config, leaving other domains and every
other setting as they are. --delete removes a domain. The change is compare-and-set on the
version read, so a concurrent change is never overwritten silently. A bad file is refused
naming the field and line, and nothing is applied.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 && len(remove) == 0 {
				return fmt.Errorf("-f FILE or --delete DOMAIN is required")
			}
			set := map[string]*envoyrl.Config{}
			for _, f := range files {
				data, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				c, err := envoyrl.Parse(data)
				if err != nil {
					return fmt.Errorf("%s: %w (nothing was applied)", f, err)
				}
				if _, dup := set[c.Domain]; dup {
					return fmt.Errorf("%s: domain %q is in two files (nothing was applied)", f, c.Domain)
				}
				set[c.Domain] = c
			}
			return o.withConfig(cmd, func(ctx context.Context, c api.ConfigClient) error {
				cur, _, err := currentDoc(ctx, c)
				if err != nil {
					return err
				}
				want := cur.Clone()
				if want.Envoy == nil {
					want.Envoy = map[string]*envoyrl.Config{}
				}
				maps.Copy(want.Envoy, set)
				for _, d := range remove {
					if _, ok := want.Envoy[d]; !ok {
						return fmt.Errorf("--delete %s: no such domain is configured (nothing was applied)", d)
					}
					delete(want.Envoy, d)
				}
				if len(want.Envoy) == 0 {
					want.Envoy = nil
				}
				if err := want.Validate(); err != nil {
					return fmt.Errorf("%w (nothing was applied)", err)
				}
				out := cmd.OutOrStdout()
				lines := diffLines(cur, want)
				for _, l := range lines {
					fmt.Fprintln(out, l)
				}
				if len(lines) == 0 {
					fmt.Fprintln(out, "no changes")
					return nil
				}
				if dryRun {
					return nil
				}
				expected := cur.Version
				resp, err := c.ApplyLimits(ctx, &api.ApplyLimitsRequest{Config: runtimecfg.ToProto(want), ExpectedVersion: &expected})
				if err != nil {
					return changeError("apply-envoy", err)
				}
				printChange(out, resp)
				return nil
			})
		},
	}
	o.register(cmd)
	cmd.Flags().StringArrayVarP(&files, "file", "f", nil, "envoyproxy/ratelimit YAML file (one domain); repeatable")
	cmd.Flags().StringArrayVar(&remove, "delete", nil, "remove a domain's configuration; repeatable")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would change, apply nothing")
	return cmd
}
