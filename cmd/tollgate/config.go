package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/metering/interval"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/server"
)

// serverSettings is everything `tollgate server` reads: the library's
// server.Config plus the settings only the command uses. Every setting is
// bound once, in options(), to a flag, a YAML key and an environment variable.
type serverSettings struct {
	cfg             server.Config
	dev             bool
	adminTokenFile  string
	logLevel        string
	logFormat       string
	shutdownTimeout time.Duration
	tls             tlsSettings // tls.go

	configFile string // --config / TOLLGATE_CONFIG; not itself a YAML key

	meterGranularity string // --metering-granularity, into cfg.Metering
	meterTimeZone    string // --metering-time-zone, into cfg.Metering

	// source records where each setting's value came from (flag name →
	// "--flag", "env TOLLGATE_X", "<file>", or "default"), so errors and --dev
	// can tell an explicit value from a default.
	source map[string]string
}

// option binds one setting. The YAML key is the flag name with '-' replaced by
// '_', the environment variable TOLLGATE_ + the YAML key in upper case.
type option struct {
	flag string
	ptr  any // *string, *int, *int64, *bool, *float64, *time.Duration or *[]string
	help string
}

func (o option) key() string { return strings.ReplaceAll(o.flag, "-", "_") }
func (o option) env() string { return "TOLLGATE_" + strings.ToUpper(o.key()) }

// options is the one table of server settings. To add one, add a line here (and
// a check in validate if some values are invalid).
func (s *serverSettings) options() []option {
	c := &s.cfg
	return []option{
		{"dev", &s.dev, "single-node development cluster with no configuration"},
		{"node-id", &c.Node.ID, "stable node id (default: hostname; \"dev\" with --dev)"},
		{"zone", &c.Node.Zone, "availability zone label"},
		{"data-dir", &c.Node.DataDir, "data directory (raft logs, snapshots); required unless --dev (then data/dev)"},
		{"grpc-addr", &c.Node.GRPCAddr, "gRPC API listen address"},
		{"http-addr", &c.Node.HTTPAddr, "HTTP (metrics, health, status) listen address; - disables"},
		{"raft-addr", &c.Raft.Addr, "raft listen address (all groups share it)"},
		{"raft-advertise", &c.Raft.Advertise, "raft address other nodes dial (default: --raft-addr)"},
		{"grpc-advertise", &c.Node.GRPCAdvertise, "gRPC address clients and other nodes dial (default: --grpc-addr)"},
		{"gossip-addr", &c.Gossip.Addr, "serf gossip listen address (TCP and UDP); - disables gossip (single node); off with --dev unless set"},
		{"gossip-advertise", &c.Gossip.Advertise, "gossip address other nodes dial (default: --gossip-addr)"},
		{"raft-max-pending-conns", &c.Raft.MaxPendingConns, "most connections to the raft port still in their handshake, a quarter of them per IP address; beyond, closed on accept (established raft connections are not counted; default 256)"},
		{"gossip-max-streams", &c.Gossip.MaxStreams, "most inbound gossip TCP streams open at once, a quarter of them per IP address; beyond, closed on accept (default 128)"},
		{"join", &c.Gossip.Join, "gossip addresses of existing members (comma-separated or repeated); retried until one answers"},
		{"bootstrap-expect", &c.Cluster.BootstrapExpect, "form a new cluster once this many nodes are alive (start exactly that many)"},
		{"replicas", &c.Cluster.Replicas, "voters per raft group (one per zone when there are that many zones)"},
		{"disable-auto-place", &c.Cluster.DisableAutoPlace, "do not add joining nodes to groups whose zone has no voter"},
		{"raft-heartbeat-timeout", &c.Raft.HeartbeatTimeout, "silence from the leader after which a follower calls an election (randomised in [T, 2T)); 0: raftnode's default"},
		{"raft-election-timeout", &c.Raft.ElectionTimeout, "how long a candidate waits for votes before retrying; ≥ --raft-heartbeat-timeout; 0: default"},
		{"raft-leader-lease-timeout", &c.Raft.LeaderLeaseTimeout, "a leader that has not heard from a quorum this long steps down; ≤ --raft-heartbeat-timeout; 0: default"},
		{"move-interval", &c.Cluster.MoveInterval, "least time between two replica moves a group leader starts to follow placement (joins, tollgate node drain); negative disables moves"},
		{"leader-balance-interval", &c.Cluster.LeaderBalanceInterval, "how often a node hands off leadership it holds beyond its share; negative disables"},
		{"admin-token", &c.Access.AdminToken, "admin credential (satisfies every scope); when set, every endpoint that writes or reveals tenant data needs a credential (docs/access-control.md); prefer TOLLGATE_ADMIN_TOKEN or --admin-token-file (a flag is visible in ps); empty: the dev default, admin API from loopback only"},
		{"admin-token-file", &s.adminTokenFile, "read the admin token from this file"},
		{"credentials-file", &c.Access.CredentialsFile, "scoped credentials (name, sha256 of the token, scopes track/meter/read/admin, optional tenants; reloaded on change): each endpoint needs a credential of its scope (docs/access-control.md); needs the admin token"},
		{"http-max-conns", &c.Bounds.HTTPMaxConns, "most open HTTP connections; at the cap the longest-idle one is closed for a new one (default 4096)"},
		{"grpc-max-conns", &c.Bounds.GRPCMaxConns, "most open gRPC connections; at the cap the connection quiet longest with no call in progress is closed for a new one (default a quarter of the file descriptor limit, at most 10000)"},
		{"grpc-max-conns-per-peer", &c.Bounds.GRPCMaxConnsPerPeer, "most open gRPC connections from one IP address (default half of --grpc-max-conns)"},
		{"grpc-idle-timeout", &c.Bounds.GRPCIdleTimeout, "a gRPC connection with no call for this long is closed (default 5m)"},
		{"max-watch-streams", &c.Bounds.MaxWatchStreams, "most long-lived streams (WatchCluster, WatchSummaries, WatchSketches, RateLimit.Sync) open on the node (default 10000)"},
		{"max-watch-streams-per-client", &c.Bounds.MaxWatchStreamsPerClient, "most such streams one client (credential, or IP address without one) holds (default 1000)"},
		{"watch-send-timeout", &c.Bounds.WatchSendTimeout, "a watch stream whose client has not read a message for this long is closed with ResourceExhausted \"slow reader\" (default 30s)"},
		{"bootstrap", &c.Cluster.Bootstrap, "bootstrap every group with this node as the only voter on first start"},
		{"enable-debug-endpoints", &c.Access.EnableDebugEndpoints, "serve /debug/pprof/ on the HTTP address, behind the admin token (loopback only without a token)"},
		{"partitions", &c.Layout.Partitions, "partitions P (fixed at cluster creation)"},
		{"groups", &c.Layout.Groups, "raft groups G (fixed at cluster creation)"},
		{"shards", &c.Layout.Shards, "shards per group S, a power of two (fixed at cluster creation)"},
		{"idle-timeout", &c.Tracking.IdleTimeout, "a series seen within this is active (whole minutes, ≤ 60m; it goes idle at most one minute later)"},
		{"default-max-series", &c.Tracking.DefaultMaxSeries, "max_series of tenants without an override; 0 = unlimited"},
		{"limits-file", &c.Limits.File, "YAML runtime limits (defaults and per-tenant overrides): in force until a runtime config is replicated, and proposed as the runtime config when it changes (see docs/limits.md)"},
		{"limits-reload-period", &c.Limits.Reload, "how often the limits file is checked for changes"},
		{"share-mode", &c.Shares.Mode, "how a tenant's max_series is split between raft groups: movable (the default: headroom moves to the groups that need it; exact per tenant) or static (fixed split ceil(max_series·n/P) of earlier builds); use the same on every node"},
		{"near-limit-fraction", &c.Summaries.NearLimitFraction, "tenants at or above this fraction of their limit are 'close to limit'"},
		{"max-hashes-per-request", &c.Tracking.MaxHashesPerRequest, "largest TrackSeries request accepted"},
		{"batch-window", &c.Tracking.BatchWindow, "how long a group leader gathers requests into one raft entry while an earlier entry is unanswered (an idle leader appends at once)"},
		{"sketch-precision", &c.Sketches.Precision, "HLL precision of per-partition sketches, 4..18 (clients must use the same)"},
		{"sketch-window", &c.Sketches.WindowMinutes, "per-partition sketch window in minutes (clients must use the same)"},
		{"sketch-partitions", &c.Sketches.Partitions, "ingest partitions accepted in sketches: 0 ≤ partition < this"},
		{"sketch-max", &c.Sketches.MaxSketches, "most (tenant, partition, minute) sketches a node holds; pushes beyond get ResourceExhausted"},
		{"sketch-peer-interval", &c.Sketches.PeerInterval, "how often a node sends changed sketches to its peers"},
		{"shutdown-timeout", &s.shutdownTimeout, "graceful shutdown bound"},
		{"metering-granularity", &s.meterGranularity, "metering sampling granularity: minute, hour, day or month"},
		{"metering-time-zone", &s.meterTimeZone, "IANA time zone of metering boundaries (days, months)"},
		{"metering-slack", &c.Metering.Slack, "metering events may be this far in the past or future"},
		{"metering-sink-url", &c.Metering.SinkURL, "HTTP collector that receives every usage record (POST JSON); empty: ledger only"},
		{"metering-ledger-retention", &c.Metering.LedgerRetention, "usage records and active-series samples older than this are dropped"},
		{"metering-test-clock", &c.Metering.TestClock, "development/test only: the admin API may set and advance the metering clock"},
		{"max-clock-offset", &c.Clock.MaxOffset, "largest clock difference between nodes the cluster tolerates; a node further than this from a majority of its peers does not lead any group"},
		{"log-level", &s.logLevel, "debug, info, warn or error"},
		{"log-format", &s.logFormat, "text or json"},
		{"tls-cert", &s.tls.cert, "node certificate (PEM): gRPC and HTTP serve TLS, calls to other nodes and raft use it too"},
		{"tls-key", &s.tls.key, "private key of --tls-cert (PEM)"},
		{"tls-ca", &s.tls.ca, "CA certificate(s) (PEM) verifying client and peer certificates"},
		{"tls-client-auth", &s.tls.clientAuth, "client certificates on gRPC (and HTTP): none, request (verified if sent) or require (mutual TLS)"},
		{"tls-http-client-auth", &s.tls.httpClientAuth, "client certificates on HTTP if different from --tls-client-auth (e.g. none for browsers and scrapers)"},
		{"raft-tls-cert", &s.tls.raftCert, "certificate for the raft transport's mutual TLS (default: --tls-cert)"},
		{"raft-tls-key", &s.tls.raftKey, "private key of --raft-tls-cert (default: --tls-key)"},
		{"raft-tls-ca", &s.tls.raftCA, "CA verifying raft peers (default: --tls-ca)"},
		{"gossip-key", &s.tls.gossipKey, "base64 key (32 bytes) encrypting serf gossip; prefer TOLLGATE_GOSSIP_KEY or --gossip-keyring-file (a flag is visible in ps)"},
		{"insecure-cluster", &c.Access.InsecureCluster, "let a multi-node cluster with credentials start with neither a gossip key nor TLS (refused otherwise): only on a network no stranger can reach; logged loudly and printed in the ready banner (docs/access-control.md)"},
		{"gossip-keyring-file", &s.tls.gossipKeyringFile, "file of base64 gossip keys, one per line or a JSON list; the first encrypts, all decrypt (rotation)"},
	}
}

// newServerSettings returns the defaults. The library's defaults come from
// server.Config.Validate, so they are written once; the command changes two:
// gossip is on (a cluster needs it) and tenants are limited by default.
func newServerSettings() (*serverSettings, error) {
	c := server.Config{Node: server.NodeConfig{DataDir: "-"}}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("library defaults: %w", err)
	}
	// Validate resolves these from the environment; the command leaves them
	// unset until the node starts.
	c.Node.DataDir, c.Node.ID, c.Logger, c.Clock.Now = "", "", nil, nil
	c.Gossip.Addr = "127.0.0.1:7302"
	c.Tracking.DefaultMaxSeries = 150_000
	return &serverSettings{
		cfg:              c,
		meterGranularity: "hour",
		meterTimeZone:    "UTC",
		logLevel:         "info",
		logFormat:        "text",
		tls:              tlsSettings{clientAuth: "none"},
		shutdownTimeout:  30 * time.Second,
		source:           map[string]string{},
	}, nil
}

// bind registers every option as a flag whose default is the current value.
func (s *serverSettings) bind(f *pflag.FlagSet) {
	f.StringVar(&s.configFile, "config", "", "YAML config file; keys are the flag names with underscores (env TOLLGATE_CONFIG)")
	bindOptions(f, s.options())
	// Fault tests only, so a hidden flag and neither a YAML key nor an
	// environment variable: a production node never runs with a shifted clock.
	f.DurationVar(&s.cfg.Clock.TestOffset, "test-clock-offset", 0, "test only: shift this node's wall clock by this much (monotonic time unchanged)")
	_ = f.MarkHidden("test-clock-offset")
}

// load completes the settings after the command line was parsed: values from
// the environment and the YAML file for every option the command line did not
// set (precedence: flag > environment > file > default), then --dev, the token
// file, and validation of every field at once.
func (s *serverSettings) load(f *pflag.FlagSet, lookupEnv func(string) (string, bool)) error {
	if err := loadOptions(f, lookupEnv, &s.configFile, s.options(), s.source); err != nil {
		return err
	}
	s.applyDev()
	if s.cfg.Gossip.Addr == "-" {
		s.cfg.Gossip.Addr = ""
	}
	if err := s.readTokenFile(); err != nil {
		return configError([]error{err})
	}
	if errs := append(s.validate(), s.buildTLS()...); len(errs) > 0 {
		return configError(errs)
	}
	return nil
}

func hasEnv(lookupEnv func(string) (string, bool), name string) bool {
	v, ok := lookupEnv(name)
	return ok && v != ""
}

// explicit reports whether a setting was given (flag, environment or file).
func (s *serverSettings) explicit(flag string) bool {
	src := s.source[flag]
	return src != "" && src != "default"
}

// applyDev: --dev bootstraps every group here, puts data in data/dev and turns
// gossip off, unless those were set explicitly.
func (s *serverSettings) applyDev() {
	if !s.dev {
		return
	}
	if s.cfg.Node.DataDir == "" {
		s.cfg.Node.DataDir = "data/dev"
	}
	if s.cfg.Node.ID == "" {
		s.cfg.Node.ID = "dev"
	}
	s.cfg.Cluster.Bootstrap = true
	if !s.explicit("gossip-addr") {
		s.cfg.Gossip.Addr = ""
	}
}

// readTokenFile replaces the token by the file's content. A token given both
// ways must agree: two different tokens is a mistake worth stopping for.
func (s *serverSettings) readTokenFile() error {
	if s.adminTokenFile == "" {
		return nil
	}
	b, err := os.ReadFile(s.adminTokenFile)
	if err != nil {
		return fmt.Errorf("admin_token_file (%s): %w", s.source["admin-token-file"], err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return fmt.Errorf("admin_token_file: %s is empty", s.adminTokenFile)
	}
	if s.cfg.Access.AdminToken != "" && s.cfg.Access.AdminToken != tok {
		return fmt.Errorf("admin_token (%s) and admin_token_file (%s) hold different tokens; give one", s.source["admin-token"], s.source["admin-token-file"])
	}
	s.cfg.Access.AdminToken = tok
	return nil
}

// validate checks every field and returns every problem, each naming the YAML
// key and where the value came from. It rejects what server.Config.Validate
// would silently replace by a default (a zero) and what would misbehave.
func (s *serverSettings) validate() []error {
	var errs []error
	c := &s.cfg
	bad := func(flag, format string, args ...any) {
		from := ""
		if src := s.source[flag]; src != "" && src != "default" {
			from = " (from " + src + ")"
		}
		errs = append(errs, fmt.Errorf("%s: %s%s", strings.ReplaceAll(flag, "-", "_"), fmt.Sprintf(format, args...), from))
	}
	if c.Node.DataDir == "" {
		bad("data-dir", "required (or use --dev)")
	}
	addr := func(flag, v string, dash bool) {
		if v == "" || (dash && v == "-") {
			return
		}
		if _, _, err := net.SplitHostPort(v); err != nil {
			bad(flag, "%q is not host:port", v)
		}
	}
	if g, err := interval.ParseGranularity(s.meterGranularity); err != nil {
		bad("metering-granularity", "%v", err)
	} else {
		c.Metering.Granularity = g
	}
	if loc, err := time.LoadLocation(s.meterTimeZone); err != nil {
		bad("metering-time-zone", "%v", err)
	} else {
		c.Metering.Location = loc
	}
	addr("grpc-addr", c.Node.GRPCAddr, false)
	addr("http-addr", c.Node.HTTPAddr, true)
	addr("raft-addr", c.Raft.Addr, false)
	addr("raft-advertise", c.Raft.Advertise, false)
	addr("grpc-advertise", c.Node.GRPCAdvertise, false)
	addr("gossip-addr", c.Gossip.Addr, false)
	addr("gossip-advertise", c.Gossip.Advertise, false)
	for _, j := range c.Gossip.Join {
		addr("join", j, false)
	}
	if c.Node.GRPCAddr == "" {
		bad("grpc-addr", "required")
	}
	if c.Raft.Addr == "" {
		bad("raft-addr", "required")
	}
	if c.Cluster.BootstrapExpect < 0 {
		bad("bootstrap-expect", "%d is negative", c.Cluster.BootstrapExpect)
	}
	if c.Gossip.Addr == "" && (len(c.Gossip.Join) > 0 || c.Cluster.BootstrapExpect > 0) {
		bad("gossip-addr", "gossip is off, but join and bootstrap_expect need it")
	}
	if c.Cluster.Bootstrap && c.Cluster.BootstrapExpect > 0 {
		what := "bootstrap"
		if s.dev {
			what = "dev"
		}
		bad("bootstrap-expect", "%d conflicts with %s (a single-voter cluster)", c.Cluster.BootstrapExpect, what)
	}
	if c.Cluster.Replicas < 1 {
		bad("replicas", "%d: must be ≥ 1", c.Cluster.Replicas)
	}
	if c.Cluster.LeaderBalanceInterval == 0 {
		bad("leader-balance-interval", "0s: give a positive interval, or a negative one to disable balancing")
	}
	if c.Cluster.MoveInterval == 0 {
		bad("move-interval", "0s: give a positive interval, or a negative one to disable replica moves")
	}
	if err := layout.ValidateLayout(c.Layout.Partitions, c.Layout.Groups, c.Layout.Shards); err != nil {
		bad("partitions", "partitions=%d groups=%d shards=%d: %v", c.Layout.Partitions, c.Layout.Groups, c.Layout.Shards, err)
	}
	switch {
	case c.Tracking.IdleTimeout%time.Minute != 0:
		bad("idle-timeout", "%v is not whole minutes", c.Tracking.IdleTimeout)
	case c.Tracking.IdleTimeout < time.Minute || c.Tracking.IdleTimeout > fsm.MaxIdleMinutes*time.Minute:
		bad("idle-timeout", "%v: must be in [1m, %dm]", c.Tracking.IdleTimeout, fsm.MaxIdleMinutes)
	}
	// Raft's timers, with raftnode's defaults for the ones not given, so a
	// bad combination names the flags instead of failing inside raft.
	hb, el, lease := c.Raft.HeartbeatTimeout, c.Raft.ElectionTimeout, c.Raft.LeaderLeaseTimeout
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"raft-heartbeat-timeout", &hb, raftnode.DefaultHeartbeatTimeout}, {"raft-election-timeout", &el, raftnode.DefaultElectionTimeout}, {"raft-leader-lease-timeout", &lease, raftnode.DefaultLeaderLeaseTimeout}} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 5*time.Millisecond:
			bad(f.name, "%v: must be ≥ 5ms (0: the default %v)", *f.v, f.def)
		}
	}
	if el < hb {
		bad("raft-election-timeout", "%v is below the heartbeat timeout %v", el, hb)
	}
	if lease > hb {
		bad("raft-leader-lease-timeout", "%v is above the heartbeat timeout %v", lease, hb)
	}
	if c.Tracking.DefaultMaxSeries < 0 {
		bad("default-max-series", "%d is negative (0 = unlimited)", c.Tracking.DefaultMaxSeries)
	}
	if c.Limits.Reload <= 0 {
		bad("limits-reload-period", "%v: must be > 0", c.Limits.Reload)
	}
	if !(c.Summaries.NearLimitFraction > 0 && c.Summaries.NearLimitFraction <= 1) {
		bad("near-limit-fraction", "%v: must be in (0, 1]", c.Summaries.NearLimitFraction)
	}
	if c.Tracking.MaxHashesPerRequest < 1 {
		bad("max-hashes-per-request", "%d: must be ≥ 1", c.Tracking.MaxHashesPerRequest)
	}
	if c.Tracking.BatchWindow < 0 || c.Tracking.BatchWindow > time.Second {
		bad("batch-window", "%v: must be in [0, 1s]", c.Tracking.BatchWindow)
	}
	if m := c.Clock.MaxOffset; m != 0 && (m < server.MinMaxClockOffset || m > server.MaxMaxClockOffset) {
		bad("max-clock-offset", "%v: must be in [%v, %v] (0: the default 1s)", m, server.MinMaxClockOffset, server.MaxMaxClockOffset)
	}
	if s.shutdownTimeout <= 0 {
		bad("shutdown-timeout", "%v: must be > 0", s.shutdownTimeout)
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(s.logLevel)); err != nil {
		bad("log-level", "%q: use debug, info, warn or error", s.logLevel)
	}
	if f := strings.ToLower(s.logFormat); f != "text" && f != "json" {
		bad("log-format", "%q: use text or json", s.logFormat)
	}
	return errs
}

// readConfigFile parses the YAML file into its top-level keys. Unknown and
// repeated keys are refused (all of them named at once), so a typo does not
// silently leave a setting at its default.
func readConfigFile(path string, opts []option) (map[string]*yaml.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // empty file: nothing set
		}
		return nil, fmt.Errorf("config file %s: %s", path, yamlErr(err))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s: want a mapping of settings (key: value) at the top level", path)
	}
	known := map[string]bool{}
	for _, o := range opts {
		known[o.key()] = true
	}
	out := map[string]*yaml.Node{}
	var errs []error
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch {
		case !known[k.Value]:
			hint := ""
			if u := strings.ReplaceAll(k.Value, "-", "_"); known[u] {
				hint = fmt.Sprintf(" (did you mean %s?)", u)
			}
			errs = append(errs, fmt.Errorf("%s:%d: unknown key %q%s", path, k.Line, k.Value, hint))
		case out[k.Value] != nil:
			errs = append(errs, fmt.Errorf("%s:%d: key %q given twice", path, k.Line, k.Value))
		default:
			out[k.Value] = v
		}
	}
	if len(errs) > 0 {
		return nil, configError(errs)
	}
	return out, nil
}

// yamlErr drops yaml.v3's "yaml: " prefix, which says nothing here.
func yamlErr(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), "yaml: "), "unmarshal errors:\n  ")
}

// configErr lists every problem, one per line.
type configErr struct{ errs []error }

func configError(errs []error) error { return &configErr{errs: errs} }

func (e *configErr) Error() string {
	lines := make([]string, len(e.errs))
	for i, err := range e.errs {
		lines[i] = "  " + err.Error()
	}
	return "invalid configuration:\n" + strings.Join(lines, "\n")
}

func (e *configErr) Unwrap() []error { return slices.Clone(e.errs) }

// bindOptions registers every option as a flag whose default is the current
// value, with its environment variable in the help.
func bindOptions(f *pflag.FlagSet, opts []option) {
	for _, o := range opts {
		help := o.help + " (env " + o.env() + ")"
		switch p := o.ptr.(type) {
		case *string:
			f.StringVar(p, o.flag, *p, help)
		case *int:
			f.IntVar(p, o.flag, *p, help)
		case *int64:
			f.Int64Var(p, o.flag, *p, help)
		case *bool:
			f.BoolVar(p, o.flag, *p, help)
		case *float64:
			f.Float64Var(p, o.flag, *p, help)
		case *time.Duration:
			f.DurationVar(p, o.flag, *p, help)
		case *[]string:
			f.StringSliceVar(p, o.flag, *p, help)
		default:
			// A programming error in an options table; TestEveryFlagHasKeyAndEnv
			// catches it before a user can.
			f.String(o.flag, "", "UNSUPPORTED OPTION TYPE")
		}
	}
}

// loadOptions fills every option the command line did not set from the
// environment, then from the YAML file (*configFile, or TOLLGATE_CONFIG):
// precedence flag > environment > file > default. source records where each
// value came from (flag name → "--flag", "env TOLLGATE_X", the file, "default").
func loadOptions(f *pflag.FlagSet, lookupEnv func(string) (string, bool), configFile *string, opts []option, source map[string]string) error {
	if !f.Changed("config") {
		if v, ok := lookupEnv("TOLLGATE_CONFIG"); ok && v != "" {
			*configFile = v
		}
	}
	var file map[string]*yaml.Node
	if *configFile != "" {
		var err error
		if file, err = readConfigFile(*configFile, opts); err != nil {
			return err
		}
	}
	var errs []error
	for _, o := range opts {
		switch {
		case f.Changed(o.flag):
			source[o.flag] = "--" + o.flag
		case hasEnv(lookupEnv, o.env()):
			v, _ := lookupEnv(o.env())
			if err := f.Lookup(o.flag).Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", o.env(), v, err))
				continue
			}
			source[o.flag] = "env " + o.env()
		case file[o.key()] != nil:
			n := file[o.key()]
			if err := n.Decode(o.ptr); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: %s", *configFile, n.Line, o.key(), yamlErr(err)))
				continue
			}
			source[o.flag] = *configFile
		default:
			source[o.flag] = "default"
		}
	}
	if len(errs) > 0 {
		return configError(errs)
	}
	return nil
}
