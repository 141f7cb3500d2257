package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/service/metering"
)

// Config configures one Tollgate node, one group of settings per part of
// the node: the node itself and its transports first, then the
// capabilities (components.go) in list order. Zero values take the
// defaults documented on each field (see Validate). A group whose
// consumer already has its own settings type (access.Bounds,
// partitionlimit.NodeConfig, metering.Config) is that type.
type Config struct {
	Node    NodeConfig    // identity, data dir, gRPC and HTTP addresses
	Raft    RaftConfig    // the raft transport and timers
	Gossip  GossipConfig  // cluster membership (serf)
	Cluster ClusterConfig // forming the cluster, placement, moves, versions
	Layout  LayoutConfig  // partitions, groups, shards
	Access  AccessConfig  // credentials, TLS, what is exposed
	// Bounds are per-connection and per-client resource limits (access.Bounds).
	Bounds   access.Bounds
	Tracking TrackingConfig // series tracking and its raft batching
	Clock    ClockConfig    // wall clock and the tolerated offset between nodes
	Logger   *slog.Logger   // default slog.Default()

	// The capabilities' settings, one group each, in list order.
	Shares    SharesConfig    // movable shares (service/shares)
	RateLimit RateLimitConfig // global rate limits (service/ratelimit)
	Summaries SummariesConfig // near-limit summaries (service/summaries)
	// Sketches configures the per-partition HLL sketch hub (service/partitionlimit).
	Sketches SketchConfig
	Limits   LimitsConfig // runtime limits file (runtime config)
	// Metering configures continuous-usage metering (service/metering).
	Metering metering.Config
}

// NodeConfig is the node's identity and its client-facing addresses.
type NodeConfig struct {
	ID      string // raft server id; default: hostname
	Zone    string // availability zone label; default "zone-a"
	DataDir string // required

	GRPCAddr      string // API + admin; default 127.0.0.1:7300
	HTTPAddr      string // metrics, health, pprof; default 127.0.0.1:7380; "-" disables
	GRPCAdvertise string // default: the gRPC listener's address
}

// Validate fills the defaults and checks the data dir is set.
func (c *NodeConfig) Validate() error {
	if c.DataDir == "" {
		return errors.New("config: Node.DataDir: data dir is required")
	}
	if c.ID == "" {
		h, _ := os.Hostname()
		if h == "" {
			h = "node"
		}
		c.ID = h
	}
	defString(&c.Zone, "zone-a")
	defString(&c.GRPCAddr, "127.0.0.1:7300")
	defString(&c.HTTPAddr, "127.0.0.1:7380")
	return nil
}

// RaftConfig is the raft transport (all groups multiplexed on one port)
// and the tuning passed to raftnode (zero = raftnode defaults).
type RaftConfig struct {
	Addr      string // default 127.0.0.1:7301
	Advertise string // default: Addr
	// MaxPendingConns caps connections to the raft port still in their
	// handshake (a quarter of it per IP address; beyond, closed on accept:
	// portcaps.go). Default raftnode.DefaultMaxPendingConns.
	MaxPendingConns int
	NoSync          bool // tests only: skip fsync
	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout override
	// raftnode's failure-detection timers (see raftnode/config.go for the
	// defaults and the constraints between them).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	ApplyTimeout                                          time.Duration // raft enqueue timeout; default 5s
}

// Validate fills the defaults and checks ranges.
func (c *RaftConfig) Validate() error {
	defString(&c.Addr, "127.0.0.1:7301")
	if c.MaxPendingConns < 0 {
		return fmt.Errorf("config: Raft.MaxPendingConns: raft_max_pending_conns %d: must be ≥ 0 (0: default)", c.MaxPendingConns)
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = 5 * time.Second
	}
	return nil
}

// GossipConfig is cluster membership (serf). Addr "" disables gossip: a
// single node that knows only itself (library users, tests). The CLI
// defaults it to 127.0.0.1:7302.
type GossipConfig struct {
	Addr          string
	Advertise     string        // default: Addr
	ProbeInterval time.Duration // failure-detection probe period; default 1s
	// MaxStreams caps inbound gossip TCP streams (a quarter of it per IP
	// address; beyond, closed on accept: portcaps.go). Default
	// membership.DefaultMaxStreams.
	MaxStreams int
	Join       []string // gossip addresses of existing members, retried until one answers
}

// Validate checks ranges.
func (c *GossipConfig) Validate() error {
	if c.MaxStreams < 0 {
		return fmt.Errorf("config: Gossip.MaxStreams: gossip_max_streams %d: must be ≥ 0 (0: default)", c.MaxStreams)
	}
	return nil
}

// ClusterConfig is how the cluster forms and keeps its replicas placed
// (cluster.Controller, clusterport.go), and the cluster version this node
// speaks (versions.go).
type ClusterConfig struct {
	// Bootstrap makes this node the only voter of every group on first start (dev).
	Bootstrap bool
	// BootstrapExpect > 0 forms a new cluster once that many members are alive:
	// each computes the same placement and bootstraps the groups it is a voter
	// of. Start exactly that many nodes for a new cluster.
	BootstrapExpect int
	Replicas        int // voters per group; default 3 (one per zone when there are three zones)
	// DisableAutoPlace stops leaders from adding joining members to groups whose
	// zone has no voter (operators then use the admin API).
	DisableAutoPlace bool
	// MoveInterval is the least time between two replica moves started by
	// one leader (cluster/move.go): each move copies a group's state to a new
	// node, so they run one at a time per leader and this far apart. Default
	// 5s; negative disables moves (joins into empty zones still happen).
	MoveInterval time.Duration
	// LeaderBalanceInterval: how often a node checks whether it leads more than
	// its share of groups; default 10s, negative disables.
	LeaderBalanceInterval time.Duration
	// MaxClusterVersion is the highest cluster version this node applies and
	// gossips (see versions.go); 0 = env TOLLGATE_MAX_CLUSTER_VERSION, else
	// fsm.CurrentClusterVersion. A lower value makes this binary behave like an
	// older build (upgrade tests); operators never need it.
	MaxClusterVersion int
}

// Validate fills the defaults and checks ranges.
func (c *ClusterConfig) Validate() error {
	defInt(&c.Replicas, 3)
	if c.MoveInterval == 0 {
		c.MoveInterval = 5 * time.Second
	}
	if c.LeaderBalanceInterval == 0 {
		c.LeaderBalanceInterval = 10 * time.Second
	}
	if c.BootstrapExpect < 0 {
		return fmt.Errorf("config: Cluster.BootstrapExpect: bootstrap-expect %d: must be ≥ 0", c.BootstrapExpect)
	}
	if c.Replicas < 1 {
		return fmt.Errorf("config: Cluster.Replicas: replicas %d: must be ≥ 1", c.Replicas)
	}
	if c.Bootstrap && c.BootstrapExpect > 0 {
		return errors.New("config: Cluster.BootstrapExpect: --dev/bootstrap (single voter, Cluster.Bootstrap) and --bootstrap-expect are exclusive")
	}
	return nil
}

// LayoutConfig is the layout, fixed at cluster creation and recorded in
// <DataDir>/cluster.json.
type LayoutConfig struct {
	Partitions, Groups, Shards int // defaults 64, 4, 16
}

// Validate fills the defaults and checks the layout.
func (c *LayoutConfig) Validate() error {
	defInt(&c.Partitions, api.DefaultPartitions)
	defInt(&c.Groups, api.DefaultGroups)
	defInt(&c.Shards, api.DefaultShards)
	if err := api.ValidateLayout(c.Partitions, c.Groups, c.Shards); err != nil {
		return fmt.Errorf("config: Layout: %w", err)
	}
	return nil
}

// AccessConfig is who may call the node and how its ports are secured
// (access/rules.go, access.go, tls.go, nodeauth.go).
type AccessConfig struct {
	// AdminToken is the admin credential (Bearer token); it satisfies every
	// scope. When set, every endpoint that writes or reveals tenant data needs
	// a credential (access/rules.go): without a credentials file, this token. Empty
	// (and no credentials file): the dev default, where admin calls are
	// accepted from loopback peers only and the rest needs no credential.
	AdminToken string
	// CredentialsFile holds scoped credentials (hashed tokens, access/credentials.go),
	// reloaded when it changes. When set, every endpoint follows the rule
	// table of access/rules.go: no endpoint that writes or reveals tenant data
	// answers without a credential of its scope. The admin token stays an
	// admin credential. Empty: the admin token is the only credential.
	CredentialsFile string
	// TLS secures gRPC, HTTP, raft and gossip (tls.go); zero value: plaintext.
	TLS TLSConfig
	// InsecureCluster lets a multi-node cluster with credentials start
	// without a gossip key or TLS (access/nodeauth.go): nodes then tell nodes from
	// strangers by a key derived from the admin token, and gossip, raft and
	// gRPC travel in plaintext. Only for networks no stranger can reach; the
	// node says so loudly at start and in /readyz's banner.
	InsecureCluster bool
	// EnableDebugEndpoints serves /debug/pprof/ on the HTTP address, behind the
	// same rule as the admin API (Bearer AdminToken, or loopback peers only when
	// no token is set). Off by default: profiles and the command line reveal
	// internals, and a CPU profile or trace is a cheap way to load a node.
	EnableDebugEndpoints bool
}

// Validate checks the credentials and TLS settings agree.
func (c *AccessConfig) Validate() error {
	if c.CredentialsFile != "" && c.AdminToken == "" {
		return errors.New("config: Access.CredentialsFile: a credentials file needs an admin token too (--admin-token-file): it is the credential that holds every scope")
	}
	return c.TLS.validate()
}

// TrackingConfig is series tracking: tenants' defaults, request bounds and
// how a group leader batches requests into raft entries (tracker.go).
type TrackingConfig struct {
	IdleTimeout         time.Duration // default 20m; whole minutes in [1m, 60m]
	DefaultMaxSeries    int64         // default max_series for tenants without override; 0 = unlimited
	MaxHashesPerRequest int           // default 100,000

	BatchWindow    time.Duration // how long the leader gathers requests into one entry while an earlier one is unanswered; default 200µs
	MaxBatchHashes int           // entry size cap; default 65,536
	MaxInFlight    int           // entries pipelined per group before backpressure; default 8
}

// Validate fills the defaults and checks ranges.
func (c *TrackingConfig) Validate() error {
	defInt(&c.MaxHashesPerRequest, 100_000)
	defInt(&c.MaxBatchHashes, 1<<16)
	defInt(&c.MaxInFlight, 8)
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 20 * time.Minute
	}
	if c.IdleTimeout%time.Minute != 0 || c.IdleTimeout < time.Minute || c.IdleTimeout > fsm.MaxIdleMinutes*time.Minute {
		return fmt.Errorf("config: Tracking.IdleTimeout: idle timeout %v: must be whole minutes in [1m, %dm]", c.IdleTimeout, fsm.MaxIdleMinutes)
	}
	if c.DefaultMaxSeries < 0 {
		return fmt.Errorf("config: Tracking.DefaultMaxSeries: default max series %d: must be ≥ 0", c.DefaultMaxSeries)
	}
	if c.BatchWindow == 0 {
		c.BatchWindow = 200 * time.Microsecond
	}
	if c.BatchWindow < 0 || c.BatchWindow > time.Second {
		return fmt.Errorf("config: Tracking.BatchWindow: batch window %v: must be in [0, 1s]", c.BatchWindow)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"MaxHashesPerRequest", c.MaxHashesPerRequest}, {"MaxBatchHashes", c.MaxBatchHashes}, {"MaxInFlight", c.MaxInFlight}} {
		if f.v < 1 {
			return fmt.Errorf("config: Tracking.%s: %d: must be ≥ 1", f.name, f.v)
		}
	}
	return nil
}

// ClockConfig is the node's wall clock and how far node clocks may
// disagree (clockport.go, clockbound).
type ClockConfig struct {
	Now func() time.Time // injectable wall clock (tests); default time.Now
	// TestOffset shifts this node's wall clock (Now) by a fixed amount
	// while its monotonic clock, timers and raft timeouts are untouched: the
	// fault tests' way to run a node whose clock is wrong. Never set it in
	// production.
	TestOffset time.Duration
	// MaxOffset is the largest difference between node clocks the
	// cluster tolerates (default 1s): nodes measure their offset to every
	// peer, and a node further than this from a majority does not lead
	// (clockbound).
	MaxOffset time.Duration
}

// Validate fills the defaults and checks ranges.
func (c *ClockConfig) Validate() error {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxOffset == 0 {
		c.MaxOffset = time.Second
	}
	if c.MaxOffset < MinMaxClockOffset || c.MaxOffset > MaxMaxClockOffset {
		return fmt.Errorf("config: Clock.MaxOffset: max clock offset %v: must be in [%v, %v]", c.MaxOffset, MinMaxClockOffset, MaxMaxClockOffset)
	}
	return nil
}

// SharesConfig configures movable shares (shares.go).
type SharesConfig struct {
	// Mode is how a tenant's max_series is split between groups:
	// "movable" (default: headroom moves, so max_series is exact per tenant;
	// service/shares) or "static" (the fixed split of earlier builds).
	Mode string
}

// Validate fills the default and checks the mode.
func (c *SharesConfig) Validate() error {
	defString(&c.Mode, ShareMovable)
	if c.Mode != ShareMovable && c.Mode != ShareStatic {
		return fmt.Errorf("config: Shares.Mode: share mode %q: must be %q or %q", c.Mode, ShareMovable, ShareStatic)
	}
	return nil
}

// RateLimitConfig configures global rate limits (ratelimit.go).
type RateLimitConfig struct {
	// Period is how often the rate-limit owner folds reports and streams
	// updates (service/ratelimit); default 100ms, the clients' report period.
	Period time.Duration
}

// Validate fills the default and checks the range.
func (c *RateLimitConfig) Validate() error {
	if c.Period == 0 {
		c.Period = defaultRatePeriod
	}
	if c.Period < time.Millisecond || c.Period > 10*time.Second {
		return fmt.Errorf("config: RateLimit.Period: rate period %v: must be in [1ms, 10s]", c.Period)
	}
	return nil
}

// SummariesConfig configures near-limit summaries (summaries.go).
type SummariesConfig struct {
	// NearLimitFraction: tenants ≥ this fraction of their share are "close
	// to limit"; default 0.85.
	NearLimitFraction float64
}

// Validate fills the default and checks the range.
func (c *SummariesConfig) Validate() error {
	if c.NearLimitFraction == 0 {
		c.NearLimitFraction = 0.85
	}
	if c.NearLimitFraction < 0 || c.NearLimitFraction > 1 {
		return fmt.Errorf("config: Summaries.NearLimitFraction: near-limit fraction %v: must be in (0, 1]", c.NearLimitFraction)
	}
	return nil
}

// LimitsConfig is the optional YAML runtime limits file, reloaded on change
// and proposed as the replicated runtime config (runtimeconfig.go).
type LimitsConfig struct {
	File   string
	Reload time.Duration // the file's poll period; default 5s
}

// Validate fills the default.
func (c *LimitsConfig) Validate() error {
	if c.Reload == 0 {
		c.Reload = 5 * time.Second
	}
	return nil
}

// Validate fills defaults and checks ranges, group by group; errors name
// the field (Group.Field). Checks that span groups come last.
func (c *Config) Validate() error {
	for _, v := range []interface{ Validate() error }{
		&c.Node, &c.Raft, &c.Gossip, &c.Cluster, &c.Layout, &c.Tracking,
		// the capabilities' groups, in list order (components.go)
		&c.Shares, &c.RateLimit, &c.Summaries, &c.Sketches, &c.Limits,
		&c.Access, &c.Clock,
	} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if err := c.Bounds.SetDefaults(); err != nil {
		return err
	}
	if c.Gossip.Addr == "" && (len(c.Gossip.Join) > 0 || c.Cluster.BootstrapExpect > 0) {
		return errors.New("config: Gossip.Addr: --join and --bootstrap-expect need gossip (set a gossip address)")
	}
	if c.multiNode() && (c.Access.AdminToken != "" || c.Access.CredentialsFile != "") && !c.clusterSecured() && !c.Access.InsecureCluster {
		return access.ErrInsecureCluster
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func defString(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

func defInt(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}
