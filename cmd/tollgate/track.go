package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/clientlib"
)

// defaultAddr is the --addr default of every client command: TOLLGATE_ADDR, or
// the dev server's address.
func defaultAddr() string {
	if a := os.Getenv("TOLLGATE_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:7300"
}

func splitAddrs(addrs string) []string {
	var out []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// connectClient returns a client once it knows the cluster's layout (from the
// first ClusterView), failing at once when no address accepts a connection:
// the client library would otherwise retry until the deadline, and a wrong
// address or a server that is not running deserves a clear answer now.
func connectClient(ctx context.Context, addrs string, timeout time.Duration, tlsOpts *clientTLSOpts) (*clientlib.Client, error) {
	return connectClientWith(ctx, addrs, timeout, tlsOpts, nil)
}

// connectClientWith is connectClient with tweak applied to the client's
// configuration before it is created (nil: none).
func connectClientWith(ctx context.Context, addrs string, timeout time.Duration, tlsOpts *clientTLSOpts, tweak func(*clientlib.Config)) (*clientlib.Client, error) {
	tc, err := tlsOpts.config()
	if err != nil {
		return nil, err
	}
	list := splitAddrs(addrs)
	if len(list) == 0 {
		return nil, errors.New("--addr: no address given")
	}
	if err := anyReachable(ctx, list); err != nil {
		return nil, err
	}
	cfg := clientlib.Config{Addrs: list, Mode: clientlib.ModeSync, TLS: tc, Token: tlsOpts.bearer()}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := clientlib.New(cfg)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.WaitReady(lctx); err != nil {
		c.Close()
		err = fmt.Errorf("learn the cluster layout from %s: %w", addrs, err)
		if tc == nil && speaksTLS(context.WithoutCancel(ctx), list[0]) {
			err = tlsHint(fmt.Errorf("%w: server preface", err), false)
		}
		if why := certProblem(context.WithoutCancel(ctx), list[0], tc); why != nil {
			return nil, fmt.Errorf("%w\n(%w)", err, why)
		}
		return nil, tlsHint(err, tc != nil)
	}
	return c, nil
}

// anyReachable succeeds when one of addrs accepts a TCP connection.
func anyReachable(ctx context.Context, addrs []string) error {
	var errs []string
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", a)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("no Tollgate node reachable (is a server running? set --addr or TOLLGATE_ADDR): %s", strings.Join(errs, "; "))
}

func newTrackCmd() *cobra.Command {
	var (
		addrs   string
		tenant  string
		count   int
		seed    uint64
		timeout time.Duration
		asJSON  bool
		tlsOpts clientTLSOpts
	)
	cmd := &cobra.Command{
		Use:   "track [HASH...]",
		Short: "Track series for a tenant and print which were accepted and rejected",
		Long: `Track series hashes for a tenant. Hashes are given as arguments (decimal or
0x-prefixed hex) or generated: --count N makes N pseudo-random hashes from --seed,
so the same command re-sends the same series. The cluster layout is learned
from the server.`,
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
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			c, err := connectClient(ctx, addrs, timeout, &tlsOpts)
			if err != nil {
				return err
			}
			defer c.Close()
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
	f.StringVar(&addrs, "addr", defaultAddr(), "comma-separated gRPC addresses of Tollgate nodes (env TOLLGATE_ADDR)")
	f.StringVar(&tenant, "tenant", "", "tenant id (required)")
	f.IntVar(&count, "count", 0, "generate this many pseudo-random hashes")
	f.Uint64Var(&seed, "seed", 1, "seed for --count")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "deadline for the whole call")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	tlsOpts.register(f)
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}
