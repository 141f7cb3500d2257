package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-io/tollgate/server"
)

// fileConfig is the YAML accepted by --config. Flags given on the command line
// override it.
type fileConfig struct {
	NodeID              string        `yaml:"node_id"`
	Zone                string        `yaml:"zone"`
	DataDir             string        `yaml:"data_dir"`
	GRPCAddr            string        `yaml:"grpc_addr"`
	HTTPAddr            string        `yaml:"http_addr"`
	RaftAddr            string        `yaml:"raft_addr"`
	RaftAdvertise       string        `yaml:"raft_advertise"`
	GRPCAdvertise       string        `yaml:"grpc_advertise"`
	GossipAddr          string        `yaml:"gossip_addr"`
	GossipAdvertise     string        `yaml:"gossip_advertise"`
	Join                []string      `yaml:"join"`
	BootstrapExpect     int           `yaml:"bootstrap_expect"`
	AdminToken          string        `yaml:"admin_token"`
	Bootstrap           bool          `yaml:"bootstrap"`
	Partitions          int           `yaml:"partitions"`
	Groups              int           `yaml:"groups"`
	Shards              int           `yaml:"shards"`
	IdleTimeout         time.Duration `yaml:"idle_timeout"`
	DefaultMaxSeries    *int64        `yaml:"default_max_series"`
	LimitsFile          string        `yaml:"limits_file"`
	NearLimitFraction   float64       `yaml:"near_limit_fraction"`
	MaxHashesPerRequest int           `yaml:"max_hashes_per_request"`
	BatchWindow         time.Duration `yaml:"batch_window"`
}

func newServerCmd() *cobra.Command {
	var (
		cfg        server.Config
		dev        bool
		configFile string
		logLevel   string
		logFormat  string
		maxSeries  int64
		shutdownTO time.Duration
		tokenFile  string
	)
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
restarts rejoins by itself (serf remembers the members in its data dir).`,
		Example: `  tollgate server --dev
  tollgate server --node-id a --zone zone-a --data-dir /var/lib/tollgate --bootstrap-expect 3 \
      --grpc-addr 10.0.0.1:7300 --raft-addr 10.0.0.1:7301 --gossip-addr 10.0.0.1:7302 --join 10.0.0.2:7302
  tollgate server --config /etc/tollgate.yaml --zone zone-b`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if configFile != "" {
				if err := applyConfigFile(configFile, &cfg, &maxSeries, cmd.Flags()); err != nil {
					return err
				}
			}
			cfg.DefaultMaxSeries = maxSeries
			if dev {
				if cfg.DataDir == "" {
					cfg.DataDir = "data/dev"
				}
				if cfg.NodeID == "" {
					cfg.NodeID = "dev"
				}
				cfg.Bootstrap = true
				if !cmd.Flags().Changed("gossip-addr") && (configFile == "" || cfg.GossipAddr == "127.0.0.1:7302") {
					cfg.GossipAddr = ""
				}
			}
			if cfg.GossipAddr == "-" {
				cfg.GossipAddr = ""
			}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("--admin-token-file: %w", err)
				}
				cfg.AdminToken = strings.TrimSpace(string(b))
			}
			if cfg.AdminToken == "" {
				cfg.AdminToken = os.Getenv("TOLLGATE_ADMIN_TOKEN")
			}
			if cfg.DataDir == "" {
				return fmt.Errorf("--data-dir is required (or use --dev)")
			}
			cfg.Logger = log
			srv, err := server.New(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			readyCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			err = srv.WaitReady(readyCtx)
			cancel()
			if err != nil && ctx.Err() == nil {
				log.Warn("node not ready yet; serving anyway", "err", err)
			}
			gossip := srv.GossipAddr()
			if gossip == "" {
				gossip = "off (single node)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tollgate node %q ready\n  zone:     %s\n  grpc:     %s\n  http:     http://%s  (/metrics /healthz /readyz /api/v1/status)\n  raft:     %s\n  gossip:   %s\n  data dir: %s\n  default max_series per tenant: %d (0 = unlimited)\n",
				srv.NodeID(), srv.Zone(), srv.GRPCAddr(), srv.HTTPAddr(), srv.RaftAddr(), gossip, cfg.DataDir, cfg.DefaultMaxSeries)
			<-ctx.Done()
			log.Info("shutting down", "timeout", shutdownTO)
			sctx, cancel := context.WithTimeout(context.Background(), shutdownTO)
			defer cancel()
			return srv.Stop(sctx)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dev, "dev", false, "single-node development cluster with no configuration")
	f.StringVar(&configFile, "config", "", "YAML config file (flags override it)")
	f.StringVar(&cfg.NodeID, "node-id", "", "stable node id (default: hostname)")
	f.StringVar(&cfg.Zone, "zone", "", "availability zone label (default zone-a)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "data directory (raft logs, snapshots)")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:7300", "gRPC API listen address")
	f.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:7380", "HTTP (metrics, health, status) listen address; - disables")
	f.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:7301", "raft listen address (all groups share it)")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "raft address other nodes dial (default: --raft-addr)")
	f.StringVar(&cfg.GRPCAdvertise, "grpc-advertise", "", "gRPC address clients and other nodes dial (default: --grpc-addr)")
	f.StringVar(&cfg.GossipAddr, "gossip-addr", "127.0.0.1:7302", "serf gossip listen address (TCP and UDP); - disables gossip (single node)")
	f.StringVar(&cfg.GossipAdvertise, "gossip-advertise", "", "gossip address other nodes dial (default: --gossip-addr)")
	f.StringSliceVar(&cfg.Join, "join", nil, "gossip addresses of existing members (comma-separated or repeated); retried until one answers")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", 0, "form a new cluster once this many nodes are alive (start exactly that many)")
	f.IntVar(&cfg.Replicas, "replicas", 3, "voters per raft group (one per zone when there are that many zones)")
	f.BoolVar(&cfg.DisableAutoPlace, "disable-auto-place", false, "do not add joining nodes to groups whose zone has no voter")
	f.DurationVar(&cfg.LeaderBalanceInterval, "leader-balance-interval", 10*time.Second, "how often a node hands off leadership it holds beyond its share; negative disables")
	f.StringVar(&cfg.AdminToken, "admin-token", "", "token for the admin API (also TOLLGATE_ADMIN_TOKEN); empty: admin API from loopback only")
	f.StringVar(&tokenFile, "admin-token-file", "", "read the admin token from this file")
	f.BoolVar(&cfg.Bootstrap, "bootstrap", false, "bootstrap every group with this node as the only voter on first start")
	f.IntVar(&cfg.Partitions, "partitions", 64, "partitions P (fixed at cluster creation)")
	f.IntVar(&cfg.Groups, "groups", 4, "raft groups G (fixed at cluster creation)")
	f.IntVar(&cfg.Shards, "shards", 16, "shards per group S, a power of two (fixed at cluster creation)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", 20*time.Minute, "a series is active if seen within this (whole minutes, ≤ 60m)")
	f.Int64Var(&maxSeries, "default-max-series", 150000, "max_series of tenants without an override; 0 = unlimited")
	f.StringVar(&cfg.LimitsFile, "limits-file", "", "YAML runtime limits (defaults and per-tenant overrides), reloaded on change")
	f.Float64Var(&cfg.NearLimitFraction, "near-limit-fraction", 0.85, "tenants at or above this fraction of their limit are 'close to limit'")
	f.IntVar(&cfg.MaxHashesPerRequest, "max-hashes-per-request", 100000, "largest TrackSeries request accepted")
	f.DurationVar(&cfg.BatchWindow, "batch-window", 200*time.Microsecond, "how long a group leader gathers requests into one raft entry")
	f.DurationVar(&shutdownTO, "shutdown-timeout", 30*time.Second, "graceful shutdown bound")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

// applyConfigFile fills cfg from YAML for every field whose flag was not set.
func applyConfigFile(path string, cfg *server.Config, maxSeries *int64, flags *pflag.FlagSet) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	setS := func(flag string, dst *string, v string) {
		if v != "" && !flags.Changed(flag) {
			*dst = v
		}
	}
	setI := func(flag string, dst *int, v int) {
		if v != 0 && !flags.Changed(flag) {
			*dst = v
		}
	}
	setD := func(flag string, dst *time.Duration, v time.Duration) {
		if v != 0 && !flags.Changed(flag) {
			*dst = v
		}
	}
	setS("node-id", &cfg.NodeID, fc.NodeID)
	setS("zone", &cfg.Zone, fc.Zone)
	setS("data-dir", &cfg.DataDir, fc.DataDir)
	setS("grpc-addr", &cfg.GRPCAddr, fc.GRPCAddr)
	setS("http-addr", &cfg.HTTPAddr, fc.HTTPAddr)
	setS("raft-addr", &cfg.RaftAddr, fc.RaftAddr)
	setS("raft-advertise", &cfg.RaftAdvertise, fc.RaftAdvertise)
	setS("limits-file", &cfg.LimitsFile, fc.LimitsFile)
	setS("grpc-advertise", &cfg.GRPCAdvertise, fc.GRPCAdvertise)
	setS("gossip-addr", &cfg.GossipAddr, fc.GossipAddr)
	setS("gossip-advertise", &cfg.GossipAdvertise, fc.GossipAdvertise)
	setS("admin-token", &cfg.AdminToken, fc.AdminToken)
	setI("bootstrap-expect", &cfg.BootstrapExpect, fc.BootstrapExpect)
	if len(fc.Join) > 0 && !flags.Changed("join") {
		cfg.Join = fc.Join
	}
	setI("partitions", &cfg.Partitions, fc.Partitions)
	setI("groups", &cfg.Groups, fc.Groups)
	setI("shards", &cfg.Shards, fc.Shards)
	setI("max-hashes-per-request", &cfg.MaxHashesPerRequest, fc.MaxHashesPerRequest)
	setD("idle-timeout", &cfg.IdleTimeout, fc.IdleTimeout)
	setD("batch-window", &cfg.BatchWindow, fc.BatchWindow)
	if fc.Bootstrap && !flags.Changed("bootstrap") {
		cfg.Bootstrap = true
	}
	if fc.NearLimitFraction != 0 && !flags.Changed("near-limit-fraction") {
		cfg.NearLimitFraction = fc.NearLimitFraction
	}
	if fc.DefaultMaxSeries != nil && !flags.Changed("default-max-series") {
		*maxSeries = *fc.DefaultMaxSeries
	}
	return nil
}
