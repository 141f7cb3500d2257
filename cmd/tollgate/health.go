package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newHealthCmd probes a node's /readyz (or /healthz) over HTTP or HTTPS. It is
// what a container healthcheck runs: the demo image holds nothing but the
// tollgate binary, so there is no curl to call.
func newHealthCmd() *cobra.Command {
	var (
		addr    string
		live    bool
		timeout time.Duration
		tlsOpts clientTLSOpts
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check that a node is ready (GET /readyz); exit status 0 when it is",
		Long: `Check a node's readiness over its HTTP address: exit status 0 and "ready"
when /readyz answers 200, else exit status 1 with the node's reason. --live asks
/healthz instead (the process answers). HTTPS is used when any TLS option is set
(--cacert, --cert, --tls, or their TOLLGATE_* environment variables).`,
		Example: `  tollgate health --http-addr 127.0.0.1:7380
  TOLLGATE_CACERT=certs/ca.pem TOLLGATE_CERT=certs/client.pem TOLLGATE_KEY=certs/client-key.pem tollgate health`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tc, err := tlsOpts.config()
			if err != nil {
				return err
			}
			scheme := "http"
			if tc != nil {
				scheme = "https"
			}
			path := "/readyz"
			if live {
				path = "/healthz"
			}
			c := &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: tc}}
			url := scheme + "://" + addr + path
			resp, err := c.Get(url)
			if err != nil {
				return fmt.Errorf("health: %w", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			msg := strings.TrimSpace(string(body))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("health: %s: %s: %s", url, resp.Status, msg)
			}
			fmt.Fprintln(cmd.OutOrStdout(), msg)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "http-addr", "127.0.0.1:7380", "the node's HTTP address (host:port)")
	f.BoolVar(&live, "live", false, "check /healthz (alive) instead of /readyz (ready to serve)")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "request deadline")
	tlsOpts.register(f)
	return cmd
}
