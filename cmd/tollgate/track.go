package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/clientlib"
)

func newTrackCmd() *cobra.Command {
	var (
		addrs      string
		tenant     string
		count      int
		seed       uint64
		partitions int
		groups     int
		timeout    time.Duration
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "track [HASH...]",
		Short: "Track series for a tenant and print which were accepted and rejected",
		Long: `Track series hashes for a tenant. Hashes are given as arguments (decimal or
0x-prefixed hex) or generated: --count N makes N pseudo-random hashes from --seed,
so the same command re-sends the same series.`,
		Example: `  tollgate track --tenant team-a --count 1000
  tollgate track --tenant team-a 0x1234abcd5678ef00 42`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var hashes []uint64
			for _, a := range args {
				h, err := strconv.ParseUint(a, 0, 64)
				if err != nil {
					return fmt.Errorf("hash %q: %w", a, err)
				}
				hashes = append(hashes, h)
			}
			if count > 0 {
				r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
				for range count {
					hashes = append(hashes, r.Uint64())
				}
			}
			if len(hashes) == 0 {
				return fmt.Errorf("no hashes: pass them as arguments or use --count")
			}
			// ModeSync: print the exact answer for every series.
			c, err := clientlib.New(clientlib.Config{Addrs: strings.Split(addrs, ","), Partitions: partitions, Groups: groups, Mode: clientlib.ModeSync})
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rejected, err := c.TrackSeries(ctx, tenant, hashes)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{
					"tenant": tenant, "sent": len(hashes), "accepted": len(hashes) - len(rejected), "rejected": rejected,
				})
			}
			fmt.Fprintf(out, "tenant %s: %d sent, %d accepted, %d rejected\n", tenant, len(hashes), len(hashes)-len(rejected), len(rejected))
			for i, h := range rejected {
				if i == 20 {
					fmt.Fprintf(out, "  … and %d more\n", len(rejected)-20)
					break
				}
				fmt.Fprintf(out, "  rejected %#016x\n", h)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addrs, "addr", "127.0.0.1:7300", "comma-separated gRPC addresses of Tollgate nodes")
	f.StringVar(&tenant, "tenant", "", "tenant id (required)")
	f.IntVar(&count, "count", 0, "generate this many pseudo-random hashes")
	f.Uint64Var(&seed, "seed", 1, "seed for --count")
	f.IntVar(&partitions, "partitions", 64, "cluster partitions P")
	f.IntVar(&groups, "groups", 4, "cluster groups G")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "deadline for the whole call")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}
