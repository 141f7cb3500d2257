package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tollgate-io/tollgate/gctune"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/server"
)

func newServerCmd() *cobra.Command { return newServerCmdWith(os.LookupEnv, runServer) }

// newServerCmdWith builds `tollgate server` with the environment lookup and
// what runs once the settings are loaded as parameters, so a test can parse a
// command line exactly as the server does without starting a node.
func newServerCmdWith(lookupEnv func(string) (string, bool), run func(*cobra.Command, *serverSettings) error) *cobra.Command {
	s, err := newServerSettings()
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a Tollgate node",
		Long: `Run a Tollgate node.

--dev starts a single-node cluster that needs no configuration: every raft group
is bootstrapped with this node as its only voter, data goes to ./data/dev unless
--data-dir says otherwise, gossip is off unless --gossip-addr is given, and the
addresses are printed once the node is ready.

A cluster: start one node per zone with --bootstrap-expect 3 and --join pointing
at another node's gossip address. The nodes form the cluster once three of them
are alive: every raft group gets one voter per zone. Nodes that join later are
added by the group leaders to groups whose zone has no voter. A node that
restarts rejoins by itself (serf remembers the members in its data dir).

Every setting is a flag, a key of the --config YAML file (the flag name with
underscores: --idle-timeout is idle_timeout) and an environment variable
(TOLLGATE_ and the key in upper case: TOLLGATE_IDLE_TIMEOUT). A flag wins over
the environment, which wins over the file, which wins over the default.
deployments/tollgate.example.yaml lists every key.

Until the node is ready it logs what it waits for; then it prints its addresses
and limits ("... ready").`,
		Example: `  tollgate server --dev
  TOLLGATE_ADMIN_TOKEN=... tollgate server --node-id a --zone zone-a --data-dir /var/lib/tollgate --bootstrap-expect 3 \
      --grpc-addr 10.0.0.1:7300 --raft-addr 10.0.0.1:7301 --gossip-addr 10.0.0.1:7302 --join 10.0.0.2:7302
  tollgate server --config /etc/tollgate.yaml --zone zone-b`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := s.load(cmd.Flags(), lookupEnv); err != nil {
				return err
			}
			return run(cmd, s)
		},
	}
	if err != nil {
		// Only a broken server.Config.Validate gets here; say so when run.
		cmd.RunE = func(*cobra.Command, []string) error { return err }
		return cmd
	}
	s.bind(cmd.Flags())
	return cmd
}

func runServer(cmd *cobra.Command, s *serverSettings) error {
	log, err := newLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	cfg := s.cfg
	cfg.Logger = log
	// Before New: restoring a large node's tables is when the heap grows.
	gctx, gcancel := context.WithCancel(context.Background())
	defer gcancel()
	go func() {
		if err := gctune.Run(gctx, gctune.Config{Logger: log}); err != nil {
			log.Warn("GC tuning", "err", err)
		}
	}()
	srv, err := server.New(cfg)
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if errors.Is(err, raftnode.ErrSnapshotCorrupt) {
		return serveRefused(ctx, cfg.Node.HTTPAddr, log, err) // refused.go
	}
	if err != nil {
		return err
	}
	if waitUntilReady(ctx, srv, log, 250*time.Millisecond) {
		printBanner(cmd.OutOrStdout(), srv, cfg.Node.DataDir, cfg.Limits.Reload, s.source["default-max-series"])
		fmt.Fprintf(cmd.OutOrStdout(), "  tls:      %s\n", serverTLSInfo(cfg.Access.TLS))
		<-ctx.Done()
	}
	log.Info("shutting down", "timeout", s.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	return srv.Stop(sctx)
}

// readiness is what waitUntilReady needs from a node (a fake in tests).
type readiness interface{ WaitingFor() string }

// waitUntilReady polls the node until it is ready (true) or ctx ends (false),
// logging what it waits for each time that changes. It never gives up on its
// own: a node that is not ready keeps saying why instead of claiming to serve.
func waitUntilReady(ctx context.Context, srv readiness, log *slog.Logger, poll time.Duration) bool {
	t := time.NewTicker(poll)
	defer t.Stop()
	last := ""
	for {
		why := srv.WaitingFor()
		if why == "" {
			return true
		}
		if why != last {
			log.Info(why)
			last = why
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// printBanner prints the ready banner. settingFrom is where the settings
// loader found --default-max-series ("--default-max-series", "env …", the
// config file, "default"): the banner names it, since a value from YAML or
// the environment is not "from the flag".
func printBanner(out io.Writer, srv *server.Server, dataDir string, reload time.Duration, settingFrom string) {
	gossip := srv.GossipAddr()
	if gossip == "" {
		gossip = "off (single node)"
	}
	li := srv.EffectiveLimits()
	limit := fmt.Sprint(li.DefaultMaxSeries)
	if li.DefaultMaxSeries == 0 {
		limit = "unlimited"
	}
	switch {
	case li.DefaultFrom != "flag": // the replicated runtime config
		limit += " (from the " + li.DefaultFrom + ")"
	case settingFrom == "" || settingFrom == "default":
		limit += " (the default; --default-max-series)"
	default:
		limit += " (from " + settingFrom + ")"
	}
	limits := "file: none (--limits-file)"
	if li.File != "" {
		limits = fmt.Sprintf("file: %s (%d tenant overrides, re-read every %v)", li.File, li.Overrides, reload)
	}
	if li.ConfigVersion > 0 {
		limits = fmt.Sprintf("runtime config version %d (%d tenant overrides; tollgate limits get)", li.ConfigVersion, li.Overrides)
		if li.File != "" {
			limits += "; file " + li.File + " is proposed when it changes"
		}
	}
	fmt.Fprintf(out, "tollgate node %q ready\n  zone:     %s\n  grpc:     %s\n  http:     %s\n  raft:     %s\n  gossip:   %s\n  data dir: %s\n  limits:   default max_series per tenant: %s; %s\n",
		srv.NodeID(), srv.Zone(), srv.GRPCAddr(), httpLine(srv), raftListen(srv.RaftAddr()), gossip, dataDir, limit, limits)
	if why := srv.InsecureCluster(); why != "" {
		fmt.Fprintf(out, "  SECURITY: INSECURE CLUSTER: %s\n", why)
	}
}

// raftListen is the raft address without the incarnation suffix ("#…") the
// node gossips with it: the banner says where the node listens, what a
// person types into --join or a firewall rule; `tollgate status` shows the
// incarnation.
func raftListen(addr string) string {
	a, _, _ := strings.Cut(addr, "#")
	return a
}

func httpLine(srv *server.Server) string {
	if srv.HTTPAddr() == "" {
		return "off"
	}
	return srv.HTTPScheme() + "://" + srv.HTTPAddr() + "  (/metrics /healthz /readyz /api/v1/status)"
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log_level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log_format %q: use text or json", format)
}
