package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	climeter "github.com/tollgate-io/tollgate/clientlib/metering"
	"github.com/tollgate-io/tollgate/service/metering"
)

// newUsageCmd is `tollgate usage`: ledger queries and active-series bills
// over a node's HTTP API (any node answers; it reads from group leaders),
// and the metering test clock over the admin gRPC API.
func newUsageCmd() *cobra.Command {
	var addr, token string
	var asJSON bool
	var tlsOpts clientTLSOpts // query and bill: HTTPS to a node serving TLS (--cacert, …)
	cmd := &cobra.Command{Use: "usage", Short: "Metering: query usage records, compute active-series bills, drive the test clock"}
	cmd.PersistentFlags().StringVar(&addr, "http", "127.0.0.1:7380", "a node's HTTP address (https:// when a TLS option is set: --cacert, --cert, --tls)")
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print the server's JSON")
	cmd.PersistentFlags().StringVar(&token, "client-token", os.Getenv("TOLLGATE_TOKEN"),
		"bearer token with the read scope, for nodes with credentials (env TOLLGATE_TOKEN; default TOLLGATE_ADMIN_TOKEN)")

	get := func(cmd *cobra.Command, path string, q url.Values, v any) error {
		tc, err := tlsOpts.config()
		if err != nil {
			return fmt.Errorf("usage: %w", err)
		}
		base := addr
		if !strings.Contains(base, "://") {
			scheme := "http://"
			if tc != nil {
				scheme = "https://"
			}
			base = scheme + base
		}
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, base+path+"?"+q.Encode(), nil)
		if err != nil {
			return fmt.Errorf("usage: %w", err)
		}
		tok := token
		if tok == "" {
			tok = os.Getenv("TOLLGATE_ADMIN_TOKEN")
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("usage: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
		if err != nil {
			return fmt.Errorf("usage: read answer: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("usage: %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(b)))
		}
		if asJSON {
			_, err := cmd.OutOrStdout().Write(b)
			return err
		}
		return json.Unmarshal(b, v)
	}

	var from, to string
	fields := []string{"organization_id", "space_id", "consumer_id", "resource_id", "plan_id", "resource_instance_id"}
	vals := make([]string, len(fields))
	var limit int
	query := &cobra.Command{
		Use:   "query",
		Short: "List usage records of the ledger by target fields and time range",
		Long: `Lists ledger records whose timestamp (the interval midpoint) lies in
[--from, --to), filtered by any of the target ids (unset = any). Times are Unix
milliseconds or RFC 3339. The last column is the duration measure in ms
(negative for corrections of late stops).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := url.Values{}
			for i, f := range fields {
				if vals[i] != "" {
					q.Set(f, vals[i])
				}
			}
			if from != "" {
				q.Set("from", from)
			}
			if to != "" {
				q.Set("to", to)
			}
			if limit > 0 {
				q.Set("limit", fmt.Sprint(limit))
			}
			var out struct {
				Records []struct {
					UsageID            string `json:"usage_id"`
					Timestamp          int64  `json:"timestamp"`
					ResourceInstanceID string `json:"resource_instance_id"`
					ConsumerID         string `json:"consumer_id"`
					MeasuredUsage      []struct {
						Measure  string  `json:"measure"`
						Quantity float64 `json:"quantity"`
					} `json:"measured_usage"`
				} `json:"records"`
			}
			if err := get(cmd, "/v1/usage", q, &out); err != nil || asJSON {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "USAGE ID\tTIMESTAMP\tCONSUMER\tINSTANCE\tMEASURES")
			for _, r := range out.Records {
				var ms []string
				for _, m := range r.MeasuredUsage {
					ms = append(ms, fmt.Sprintf("%s=%g", m.Measure, m.Quantity))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.UsageID, time.UnixMilli(r.Timestamp).UTC().Format(time.RFC3339Nano), r.ConsumerID, r.ResourceInstanceID, strings.Join(ms, " "))
			}
			return w.Flush()
		},
	}
	for i, f := range fields {
		query.Flags().StringVar(&vals[i], strings.ReplaceAll(f, "_", "-"), "", f)
	}
	query.Flags().StringVar(&from, "from", "", "start of the range (Unix ms or RFC 3339)")
	query.Flags().StringVar(&to, "to", "", "end of the range, exclusive")
	query.Flags().IntVar(&limit, "limit", 0, "at most this many records (server bound 10,000)")

	var tenant, bfrom, bto string
	bill := &cobra.Command{
		Use:   "bill",
		Short: "95th percentile of a tenant's per-minute active series over a period",
		RunE: func(cmd *cobra.Command, args []string) error {
			if tenant == "" || bfrom == "" || bto == "" {
				return fmt.Errorf("usage bill: --tenant, --from and --to are required")
			}
			var b metering.Bill
			if err := get(cmd, "/v1/usage/bill", url.Values{"tenant": {tenant}, "from": {bfrom}, "to": {bto}}, &b); err != nil || asJSON {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "tenant %s, %s to %s: p95 active series %d (max %d, %d minutes sampled)\n", b.Tenant,
				time.UnixMilli(b.From).UTC().Format(time.RFC3339), time.UnixMilli(b.To).UTC().Format(time.RFC3339), b.P95, b.Max, b.Minutes)
			return err
		},
	}
	bill.Flags().StringVar(&tenant, "tenant", "", "tenant id")
	bill.Flags().StringVar(&bfrom, "from", "", "start (Unix ms or RFC 3339)")
	bill.Flags().StringVar(&bto, "to", "", "end, exclusive")
	tlsOpts.registerTLS(query.Flags())
	tlsOpts.registerTLS(bill.Flags())
	cmd.AddCommand(query, bill, newUsageClockCmd(&asJSON))
	return cmd
}

// newUsageClockCmd is `tollgate usage clock`: the metering test clock of
// each node named by --addr, through the admin gRPC API (Metering.SetClock;
// the admin token, not --http).
func newUsageClockCmd(asJSON *bool) *cobra.Command {
	var o adminOpts
	var set string
	var advance time.Duration
	cmd := &cobra.Command{
		Use:   "clock [--set T] [--advance D]",
		Short: "Set or advance the metering test clock of nodes started with --metering-test-clock",
		Long: `Sets (--set: Unix milliseconds or RFC 3339) and then advances (--advance: a Go
duration such as 90m or 720h) the metering clock of every node in --addr; with
neither flag it prints each node's clock. Once set, a node's clock stands still
except when advanced, so month-granularity sampling runs in seconds. Set every
node: the clock of the leader of a group stamps its entries. A node not started
with --metering-test-clock refuses (FailedPrecondition). Admin API: give --token
(or TOLLGATE_ADMIN_TOKEN) when the nodes have one. Not retried: a repeated
advance would move the clock twice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var at *time.Time
			if set != "" {
				t, err := parseUsageTime(set)
				if err != nil {
					return fmt.Errorf("usage clock: --set: %w", err)
				}
				at = &t
			}
			if advance < 0 {
				return fmt.Errorf("usage clock: --advance %v: the clock cannot move backwards", advance)
			}
			addrs := splitAddrs(o.addrs)
			if len(addrs) == 0 {
				return fmt.Errorf("usage clock: --addr names no node")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			for _, addr := range addrs {
				one := o
				one.addrs = addr
				cc, err := one.dialFirst(ctx)
				if err != nil {
					return fmt.Errorf("usage clock: %w", err)
				}
				clk, err := climeter.New(cc).SetClock(ctx, at, advance)
				cc.Close()
				if err != nil {
					return fmt.Errorf("usage clock: %s: %w", addr, err)
				}
				if *asJSON {
					b, _ := json.Marshal(map[string]any{"addr": addr, "now_ms": clk.Now.UnixMilli(), "test_clock": clk.TestClock})
					fmt.Fprintln(out, string(b))
					continue
				}
				mode := "test clock"
				if !clk.TestClock {
					mode = "wall clock, not settable"
				}
				fmt.Fprintf(out, "%s: metering clock %s (%s)\n", addr, clk.Now.UTC().Format(time.RFC3339Nano), mode)
			}
			return nil
		},
	}
	o.register(cmd)
	cmd.Flags().StringVar(&set, "set", "", "fix the clock at this time (Unix ms or RFC 3339)")
	cmd.Flags().DurationVar(&advance, "advance", 0, "then move it forward by this much")
	return cmd
}

// parseUsageTime reads Unix milliseconds or RFC 3339, as the HTTP API does.
func parseUsageTime(v string) (time.Time, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.UnixMilli(n), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither Unix milliseconds nor RFC 3339", v)
	}
	return t, nil
}
