package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	runtimecfgsvc "github.com/tollgate-io/tollgate/service/runtimecfg"
)

// `tollgate limits …`: the replicated runtime configuration through the
// Config service (token-protected like the admin API).

func newLimitsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Read and change the replicated runtime limits (get, set, apply -f, diff -f, apply-envoy -f)",
		Long: `The runtime limits (per-tenant max_series, max_series_per_partition, ingestion_rate,
ingestion_burst, sample_rates, with defaults; global sample_rates and backlog_controller;
the Envoy rate limit service's domains) live in raft: every node decides from the same version. Every change makes a new version;
a bad value is refused naming the field, and nothing is applied.`,
	}
	cmd.AddCommand(newLimitsGetCmd(), newLimitsSetCmd(), newLimitsApplyCmd(), newLimitsDiffCmd(), newLimitsApplyEnvoyCmd())
	return cmd
}

// withConfig opens the command's connection and calls fn with a Config client.
func (o *adminOpts) withConfig(cmd *cobra.Command, fn func(ctx context.Context, c api.ConfigClient) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	cc, err := o.dialFirst(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	return fn(ctx, api.NewConfigClient(cc))
}

func getLimits(ctx context.Context, c api.ConfigClient, tenant string) (*api.GetLimitsResponse, error) {
	resp, err := retryCall(ctx, func(ctx context.Context) (*api.GetLimitsResponse, error) {
		return c.GetLimits(ctx, &api.GetLimitsRequest{Tenant: tenant})
	})
	if err != nil {
		return nil, fmt.Errorf("get limits: %w", err)
	}
	return resp, nil
}

func newLimitsGetCmd() *cobra.Command {
	var o adminOpts
	var tenant string
	var asJSON, global bool
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print the runtime limits (YAML; the version is the `version:` key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConfig(cmd, func(ctx context.Context, c api.ConfigClient) error {
				resp, err := getLimits(ctx, c, tenant)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					b, _ := protojson.MarshalOptions{Multiline: true}.Marshal(resp)
					_, err := fmt.Fprintln(out, string(b))
					return err
				}
				printSource(out, resp)
				doc, err := runtimecfgsvc.FromProto(resp.Config)
				if err != nil {
					return fmt.Errorf("the server sent an invalid document: %w", err)
				}
				doc.Version = resp.Version
				if global { // only the global settings, and the controller's state
					doc = &runtimecfg.Document{Version: doc.Version, Global: doc.Global}
				}
				if _, err := out.Write(runtimecfg.RenderYAML(doc)); err != nil {
					return err
				}
				if e := resp.Effective; e != nil {
					fmt.Fprintf(out, "# effective for %s: max_series=%d max_series_per_partition=%d ingestion_rate=%g ingestion_burst=%d\n",
						tenant, e.GetMaxSeries(), e.GetMaxSeriesPerPartition(), e.GetIngestionRate(), e.GetIngestionBurst())
				}
				if global || resp.Controller.GetKind() != "" {
					printController(out, resp.Controller)
				}
				return nil
			})
		},
	}
	o.register(cmd)
	cmd.Flags().StringVar(&tenant, "tenant", "", "show only the defaults and this tenant's entry, and its effective limits")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the raw answer as JSON")
	cmd.Flags().BoolVar(&global, "global", false, "show only the global settings and the backlog controller's state")
	return cmd
}

// printController prints the backlog controller's state as YAML comments, so
// the output still applies as a file.
func printController(out io.Writer, c *api.SamplingControllerStatus) {
	if c == nil {
		return
	}
	owner := c.Owner
	if owner == "" {
		owner = "unknown (no leader of group 0)"
	}
	switch {
	case c.Kind == "":
		fmt.Fprintf(out, "# backlog controller: off: %s\n", c.Reason)
	case !c.Enabled:
		fmt.Fprintf(out, "# backlog controller (%s) on %s: DISABLED: %s\n", c.Kind, owner, c.Reason)
	default:
		input := "no fresh report"
		if c.HasInput {
			input = fmt.Sprintf("%g", c.InputBacklog)
		}
		fmt.Fprintf(out, "# backlog controller (%s) on %s: enabled; output %g%% (written %g%%, %d writes), input backlog %s, target %g, %d sources, %d steps, %d reports (%d rejected)\n",
			c.Kind, owner, c.OutputPercent, c.WrittenPercent, c.Writes, input, c.TargetBacklog, c.Sources, c.Steps, c.Reports, c.RejectedReports)
		if c.LastWriteError != "" {
			fmt.Fprintf(out, "# backlog controller: last write failed: %s\n", c.LastWriteError)
		}
	}
}

func printSource(out io.Writer, resp *api.GetLimitsResponse) {
	if resp.Source == "replicated" {
		fmt.Fprintf(out, "# runtime config version %d (replicated; served by %s)\n", resp.Version, resp.ServedBy)
		return
	}
	fmt.Fprintf(out, "# no replicated runtime config: %s\n", resp.SourceReason)
}

func newLimitsSetCmd() *cobra.Command {
	var o adminOpts
	var tenant string
	var defaults, global, clearScope bool
	var unset []string
	var expect int64
	cmd := &cobra.Command{
		Use:   "set (--tenant T | --defaults | --global) key=value...",
		Short: "Set (or --unset) keys of one scope: a tenant, the defaults or the global settings",
		Long: `Keys of a tenant or the defaults: max_series, max_series_per_partition, ingestion_rate,
ingestion_burst, unlimited=true, sample_rates.<kind>=<percent>.
Global keys: sample_rates.<kind>=<percent>, backlog_controller.<kind|target|period|kp|ki|min_percent>
(a new controller needs kind, target, period and kp in one call; --unset backlog_controller removes it).
Only the named keys change, on top of the current version (or only at --expect-version).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &api.SetLimitsRequest{Tenant: tenant, Defaults: defaults, Global: global, Unset: unset, Clear: clearScope, Set: map[string]string{}}
			for _, a := range args {
				op, err := runtimecfg.ParseSetArg(a)
				if err != nil {
					return err
				}
				if _, dup := req.Set[op.Key]; dup {
					return fmt.Errorf("%s given twice", op.Key)
				}
				req.Set[op.Key] = op.Value
			}
			if expect >= 0 {
				v := uint64(expect)
				req.ExpectedVersion = &v
			}
			return o.withConfig(cmd, func(ctx context.Context, c api.ConfigClient) error {
				resp, err := c.SetLimits(ctx, req)
				if err != nil {
					return changeError("set limits", err)
				}
				printChange(cmd.OutOrStdout(), resp)
				return nil
			})
		},
	}
	o.register(cmd)
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "the tenant whose entry to change")
	f.BoolVar(&defaults, "defaults", false, "change the defaults")
	f.BoolVar(&global, "global", false, "change the global settings")
	f.StringArrayVar(&unset, "unset", nil, "a key to remove (inherit again); repeatable")
	f.BoolVar(&clearScope, "clear", false, "remove every key of the scope first (a tenant's entry disappears)")
	f.Int64Var(&expect, "expect-version", -1, "apply only if the config is at this version")
	return cmd
}

func changeError(what string, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument:
		return fmt.Errorf("%s: refused: %s", what, st.Message())
	case codes.Aborted:
		return fmt.Errorf("%s: %s", what, st.Message())
	}
	return fmt.Errorf("%s: %w (the change may or may not have been applied: check with tollgate limits get)", what, err)
}

func printChange(out io.Writer, resp *api.LimitsChangeResponse) {
	if !resp.Changed {
		fmt.Fprintf(out, "unchanged: runtime config stays at version %d\n", resp.Version)
		return
	}
	fmt.Fprintf(out, "runtime config version %d (in %d of %d groups; the others follow within a moment)\n", resp.Version, resp.GroupsAtVersion, resp.Groups)
}

// readLimitsFile parses a YAML limits file; errors name the field and line.
func readLimitsFile(path string) (*runtimecfg.Document, *uint64, error) {
	if path == "" {
		return nil, nil, fmt.Errorf("-f FILE is required")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	d, exp, err := runtimecfg.ParseYAML(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w (nothing was applied)", path, err)
	}
	return d, exp, nil
}

// diffLines compares two documents setting by setting.
func diffLines(from, to *runtimecfg.Document) []string {
	a, b := map[string]string{}, map[string]string{}
	var keys []string
	for _, kv := range runtimecfg.Flatten(from) {
		a[kv.Key] = kv.Value
		keys = append(keys, kv.Key)
	}
	for _, kv := range runtimecfg.Flatten(to) {
		b[kv.Key] = kv.Value
		if _, ok := a[kv.Key]; !ok {
			keys = append(keys, kv.Key)
		}
	}
	var out []string
	for _, k := range keys {
		va, ina := a[k]
		vb, inb := b[k]
		switch {
		case ina && !inb:
			out = append(out, fmt.Sprintf("- %s: %s", k, va))
		case !ina && inb:
			out = append(out, fmt.Sprintf("+ %s: %s", k, vb))
		case va != vb:
			out = append(out, fmt.Sprintf("~ %s: %s → %s", k, va, vb))
		}
	}
	return out
}

// currentDoc reads the replicated document (empty when none yet).
func currentDoc(ctx context.Context, c api.ConfigClient) (*runtimecfg.Document, *api.GetLimitsResponse, error) {
	resp, err := getLimits(ctx, c, "")
	if err != nil {
		return nil, nil, err
	}
	if resp.Source != "replicated" {
		return &runtimecfg.Document{}, resp, nil
	}
	d, err := runtimecfgsvc.FromProto(resp.Config)
	if err != nil {
		return nil, nil, fmt.Errorf("the server sent an invalid document: %w", err)
	}
	d.Version = resp.Version
	return d, resp, nil
}

func newLimitsDiffCmd() *cobra.Command {
	var o adminOpts
	var file string
	cmd := &cobra.Command{
		Use:   "diff -f limits.yaml",
		Short: "Show what apply -f would change (- removed, + added, ~ changed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			want, _, err := readLimitsFile(file)
			if err != nil {
				return err
			}
			return o.withConfig(cmd, func(ctx context.Context, c api.ConfigClient) error {
				cur, resp, err := currentDoc(ctx, c)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				printSource(out, resp)
				lines := diffLines(cur, want)
				if len(lines) == 0 {
					fmt.Fprintln(out, "no changes")
					return nil
				}
				fmt.Fprintln(out, strings.Join(lines, "\n"))
				return nil
			})
		},
	}
	o.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML limits file")
	return cmd
}

func newLimitsApplyCmd() *cobra.Command {
	var o adminOpts
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f limits.yaml",
		Short: "Replace the whole runtime config with a file's, atomically",
		Long: `The file replaces every setting (keys it leaves out are removed). It applies only on top
of the version the diff was computed against — or of the file's own version: key, as written
by tollgate limits get — so a concurrent change is never overwritten silently.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			want, exp, err := readLimitsFile(file)
			if err != nil {
				return err
			}
			return o.withConfig(cmd, func(ctx context.Context, c api.ConfigClient) error {
				cur, _, err := currentDoc(ctx, c)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				expected := cur.Version
				if exp != nil {
					expected = *exp
				}
				for _, l := range diffLines(cur, want) {
					fmt.Fprintln(out, l)
				}
				resp, err := c.ApplyLimits(ctx, &api.ApplyLimitsRequest{Config: runtimecfgsvc.ToProto(want), ExpectedVersion: &expected})
				if err != nil {
					return changeError("apply "+file, err)
				}
				printChange(out, resp)
				return nil
			})
		},
	}
	o.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML limits file")
	return cmd
}
