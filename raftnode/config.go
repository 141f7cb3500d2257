package raftnode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// Defaults. They target a LAN (or loopback) cluster where the product bar is
// that tracking resumes within 1 s (median) after a leader dies, and that a
// steady cluster holds no election.
//
// Failover budget with these values: a follower checks for silence every
// HeartbeatTimeout..2×HeartbeatTimeout (raft randomises each wait in
// [T, 2T)) and calls an election once the leader has been silent ≥ T, i.e.
// 0.4–1.2 s after a kill; pre-vote + vote take a few LAN round trips; a split
// vote would cost another ElectionTimeout..2×ElectionTimeout per round, and on
// a busy host the survivors' timers bunch up enough that randomisation alone
// left 2–5 such rounds (2.5–5.8 s): the survivors defer to the group's
// successor instead (succession.go). The new leader commits its no-op within
// one round trip.
//
// Measured on a loaded 2-core VM (BENCHMARKS.md): leader SIGKILL → next
// acknowledged write median 1.1–1.2 s with 500 ms timers, 0.7 s with 300 ms;
// but 300 ms timers with a 250 ms lease held 16 elections in 10 minutes on that
// host under load: a leader process descheduled for 250–460 ms saw both
// followers silent and stepped down (raft's lease check), and followers'
// heartbeat timers fired. The lease is what a stalled leader trips over, so it
// is as long as raft allows (= HeartbeatTimeout), and both sit at 400 ms.
const (
	// DefaultGroups is the number of raft groups per node.
	DefaultGroups = 4

	// DefaultHeartbeatTimeout: how long a follower tolerates silence from
	// the leader before starting an election (checked at random intervals in
	// [T, 2T)). The leader sends heartbeats every T/10 = 40 ms, so a spurious
	// election needs a stall of the leader or the network of ≥ T; pre-vote
	// keeps a single stalled follower from disturbing the others. raft's 1 s
	// default is tuned for WANs.
	DefaultHeartbeatTimeout = 400 * time.Millisecond

	// DefaultElectionTimeout: how long a candidate waits for a vote result
	// before retrying (randomised in [T, 2T)); only matters on split votes.
	// raft requires it ≥ HeartbeatTimeout.
	DefaultElectionTimeout = 400 * time.Millisecond

	// DefaultLeaderLeaseTimeout: a leader that has not heard from a quorum
	// for this long steps down, so a leader cut off from its peers stops
	// accepting writes (its pending Applies fail with ErrLeadershipLost /
	// ErrNotLeader) at about the time the others elect a replacement (commits
	// need a quorum either way: this only bounds how long a cut-off leader
	// keeps clients waiting). A leader that was itself descheduled also sees
	// its followers silent, so a short lease turns host hiccups into
	// elections: the longest raft allows, HeartbeatTimeout.
	DefaultLeaderLeaseTimeout = 400 * time.Millisecond

	// DefaultCommitTimeout: when no new entries arrive, the leader still
	// sends an AppendEntries every CommitTimeout..2×CommitTimeout so that
	// followers learn the commit index and apply promptly. 5 ms keeps
	// follower FSMs within a few ms of the leader; the cost is 100–200 empty
	// RPCs/s per follower per group, negligible on a LAN. (raft's default of
	// 50 ms makes follower state visibly lag.)
	DefaultCommitTimeout = 5 * time.Millisecond

	// DefaultMaxAppendEntries: max entries per AppendEntries RPC and per
	// leader group-commit (one disk fsync). Steady-state batches are small
	// (the server pipelines at most a handful of entries per group), so this
	// mostly bounds catch-up RPCs for a lagging follower. Note the memory
	// bound is MaxAppendEntries × max entry size on both sides; lower it if
	// entries are large. raft caps it at 1024.
	DefaultMaxAppendEntries = 256

	// DefaultSnapshotInterval / DefaultSnapshotThreshold: raft checks every
	// SnapshotInterval..2×SnapshotInterval and snapshots when at least
	// SnapshotThreshold entries were logged since the last snapshot. This
	// bounds restart replay to about Threshold + TrailingLogs entries
	// without snapshotting an idle group.
	DefaultSnapshotInterval  = 30 * time.Second
	DefaultSnapshotThreshold = 4096

	// DefaultTrailingLogs: entries kept in the log after a snapshot, so a
	// follower that lags by less than this (restart, short partition)
	// catches up from the log instead of receiving a whole snapshot.
	DefaultTrailingLogs = 2048

	// DefaultSnapshotRetain: snapshots kept on disk per group. Two, so that
	// if the newest is unreadable raft falls back to the previous one (raft
	// tries them newest first at start). That works only while the log
	// still reaches back to the previous one (TrailingLogs at least the
	// entries between two snapshots); with the defaults it usually does
	// not, and New then refuses the group with ErrSnapshotCorrupt rather
	// than let raft panic on the first entry it lacks (snapcheck.go;
	// TestSnapshotFallback, TestSnapshotCorruptRefused).
	DefaultSnapshotRetain = 2

	// DefaultTransportTimeout: dial timeout and per-RPC I/O deadline of the
	// raft transport (InstallSnapshot scales it with the snapshot size).
	// It is not on the failover path: a dead peer refuses or resets
	// connections, and RPCs to an unreachable peer run on per-peer
	// goroutines that never block the election or the quorum.
	DefaultTransportTimeout = 10 * time.Second

	// DefaultTransportMaxPool: idle outbound connections kept per peer per
	// group.
	DefaultTransportMaxPool = 3

	// logCacheSize: recent log entries kept in memory per group in front
	// of bolt, so replication to followers rarely reads the disk.
	logCacheSize = 512
)

// boltOpenTimeout bounds waiting for the flock of raft.db (another process,
// or another Host in this process, using the same DataDir). A variable so
// tests can shorten it.
var boltOpenTimeout = 2 * time.Second

// Config configures a Host. Zero values mean "use the default"; Validate
// fills them in. Timer staggering: none is applied across groups, because
// raft already draws every heartbeat/election wait at random in [T, 2T)
// independently per group, which desynchronises the groups' elections.
type Config struct {
	// NodeID is this node's raft ServerID in every group. It must be stable
	// across restarts (it is stored in the raft configuration).
	NodeID string

	// DataDir holds one directory per group:
	// <DataDir>/group-<g>/raft.db and <DataDir>/group-<g>/snapshots/.
	DataDir string

	// BindAddr is the shared raft listener, e.g. "10.0.0.5:7301" or
	// "127.0.0.1:0" (tests; the chosen port is then in Addr()).
	BindAddr string

	// AdvertiseAddr is the address other nodes dial to reach BindAddr. It
	// must not be an unspecified IP. Default: the listener's address; if
	// that is unspecified (BindAddr ":7301" or "0.0.0.0:7301"), 127.0.0.1
	// with the bound port is used and a warning logged: fine for a single
	// node, wrong for a cluster.
	AdvertiseAddr string

	// Groups is G, the number of raft groups. Default 4; at most 65536.
	// New opens more when the data dir's group list records groups added
	// at runtime (Host.AddGroup, ListedGroups).
	Groups int

	// Bootstrap: if true, every group that has no existing state on disk is
	// bootstrapped with this node as its only voter (dev / single-node
	// mode). Groups with state are left alone, so it is safe to keep set
	// across restarts.
	Bootstrap bool

	// Raft tuning; see the Default* constants for what each does and why
	// the default was chosen.
	HeartbeatTimeout   time.Duration // default 400ms; ≥ 5ms
	ElectionTimeout    time.Duration // default 400ms; ≥ HeartbeatTimeout
	LeaderLeaseTimeout time.Duration // default 400ms; ≥ 5ms and ≤ HeartbeatTimeout
	CommitTimeout      time.Duration // default 5ms; ≥ 1ms
	MaxAppendEntries   int           // default 256; 1..1024
	SnapshotInterval   time.Duration // default 30s; ≥ 5ms
	SnapshotThreshold  uint64        // default 4096
	TrailingLogs       uint64        // default 2048
	SnapshotRetain     int           // default 2; ≥ 1

	// Transport tuning.
	TransportTimeout time.Duration // default 10s
	TransportMaxPool int           // default 3
	HandshakeTimeout time.Duration // default 5s: TLS + header read on accepted conns
	// MaxPendingConns caps accepted connections still in their handshake
	// (MuxConfig.MaxPendingConns; a quarter of it per IP address). Default
	// DefaultMaxPendingConns.
	MaxPendingConns int

	// ServerTLS / ClientTLS enable TLS on the raft port (see MuxConfig).
	// Both or neither must be set.
	ServerTLS *tls.Config
	ClientTLS *tls.Config
	// ClusterKeys authenticate the raft connection header (MuxConfig).
	ClusterKeys [][]byte

	// DiskCheckInterval: how often the data dir is probed for writability
	// (DiskError). Default DefaultDiskCheckInterval (1s).
	DiskCheckInterval time.Duration
	// Identity binds the raft port to this data dir's incarnation and
	// cluster (identity.go). With an Incarnation, Addr() names it and
	// connections meant for another incarnation are refused. Zero value:
	// no checks.
	Identity Identity

	// NoSync skips fsync in the log store. Tests only: with it a crash can
	// lose acknowledged entries. Default false (durable).
	NoSync bool

	// Logger receives this package's logs and raft's own (bridged from
	// hclog). Default slog.Default().
	Logger *slog.Logger
	// RaftLogLevel is the minimum level of raft's internal messages that are
	// forwarded to Logger (on top of Logger's own level). Default
	// slog.LevelWarn: raft is chatty at Info (every state change, every
	// snapshot, ×G groups); the Host itself logs leadership changes at
	// Info. Set slog.LevelInfo or slog.LevelDebug to see raft's details.
	RaftLogLevel slog.Leveler

	// LeaderNotify, if set, is called whenever this node gains (true) or
	// loses (false) leadership of a group. Calls for one group are made in
	// order from one goroutine and never concurrently; different groups
	// may be notified concurrently. Every transition raft reports is
	// delivered (queued without bound, never coalesced), and raft is never
	// blocked by a slow callback — but a slow callback delays the later
	// notifications of its group. On Shutdown, if the last value delivered
	// for a group was true, a final false is delivered before Shutdown
	// returns, so the callback must not wait for Shutdown to finish.
	LeaderNotify func(group int, isLeader bool)

	// MayCampaign, if set, is asked before this node requests a vote or
	// pre-vote and when a leader hands it leadership (TimeoutNow): an error
	// refuses both (gate.go), so the node cannot become any group's leader
	// while it answers one. It is called from raft's goroutines: it must be
	// fast and must not call into the Host. The server shuts it while this
	// node's clock is not confirmed against a majority of clocks.
	MayCampaign func() error
	// GroupMayCampaign, if set, is asked with MayCampaign for one group: an
	// error keeps this node from leading that group only. The server shuts
	// it for a group created while it runs (AddGroup) until the group's
	// leader path exists. Same rules as MayCampaign, except that a pre-vote
	// it refuses is answered as refused at once, without an error and
	// without reaching the peer (gate.go).
	GroupMayCampaign func(group int) error
}

// Validate fills in defaults and checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("raftnode config: "+format, args...))
	}
	durDefault := func(p *time.Duration, def time.Duration) {
		if *p == 0 {
			*p = def
		}
	}

	if c.NodeID == "" {
		bad("NodeID is required")
	}
	if c.DataDir == "" {
		bad("DataDir is required")
	}
	if c.BindAddr == "" {
		bad("BindAddr is required")
	} else if _, _, err := net.SplitHostPort(c.BindAddr); err != nil {
		bad("BindAddr %q: %v", c.BindAddr, err)
	}
	if c.AdvertiseAddr != "" {
		host, port, err := net.SplitHostPort(c.AdvertiseAddr)
		switch {
		case err != nil:
			bad("AdvertiseAddr %q: %v", c.AdvertiseAddr, err)
		case host == "" || port == "" || port == "0":
			bad("AdvertiseAddr %q must have a host and a non-zero port", c.AdvertiseAddr)
		default:
			if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
				bad("AdvertiseAddr %q must not be an unspecified address", c.AdvertiseAddr)
			}
		}
	}

	if c.Identity.Incarnation != "" {
		if err := ValidID(c.Identity.Incarnation); err != nil {
			bad("Identity.Incarnation: %v", err)
		}
	}
	if c.Identity.ClusterID != "" {
		if err := ValidID(c.Identity.ClusterID); err != nil {
			bad("Identity.ClusterID: %v", err)
		}
	}

	if c.Groups == 0 {
		c.Groups = DefaultGroups
	}
	if c.Groups < 1 || c.Groups > MaxGroups {
		bad("Groups = %d, want 1..%d", c.Groups, MaxGroups)
	}

	durDefault(&c.HeartbeatTimeout, DefaultHeartbeatTimeout)
	durDefault(&c.ElectionTimeout, DefaultElectionTimeout)
	durDefault(&c.LeaderLeaseTimeout, DefaultLeaderLeaseTimeout)
	durDefault(&c.CommitTimeout, DefaultCommitTimeout)
	durDefault(&c.SnapshotInterval, DefaultSnapshotInterval)
	durDefault(&c.TransportTimeout, DefaultTransportTimeout)
	durDefault(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	durDefault(&c.DiskCheckInterval, DefaultDiskCheckInterval)
	if c.MaxAppendEntries == 0 {
		c.MaxAppendEntries = DefaultMaxAppendEntries
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = DefaultTrailingLogs
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = DefaultSnapshotRetain
	}
	if c.TransportMaxPool == 0 {
		c.TransportMaxPool = DefaultTransportMaxPool
	}

	if c.HeartbeatTimeout < 5*time.Millisecond {
		bad("HeartbeatTimeout %v < 5ms", c.HeartbeatTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		bad("ElectionTimeout %v < HeartbeatTimeout %v", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	if c.LeaderLeaseTimeout < 5*time.Millisecond || c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		bad("LeaderLeaseTimeout %v must be in [5ms, HeartbeatTimeout %v]", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.CommitTimeout < time.Millisecond {
		bad("CommitTimeout %v < 1ms", c.CommitTimeout)
	}
	if c.MaxAppendEntries < 1 || c.MaxAppendEntries > 1024 {
		bad("MaxAppendEntries = %d, want 1..1024", c.MaxAppendEntries)
	}
	if c.SnapshotInterval < 5*time.Millisecond {
		bad("SnapshotInterval %v < 5ms", c.SnapshotInterval)
	}
	if c.SnapshotRetain < 1 {
		bad("SnapshotRetain = %d, want ≥ 1", c.SnapshotRetain)
	}
	if c.TransportTimeout < 0 {
		bad("TransportTimeout %v < 0", c.TransportTimeout)
	}
	if c.TransportMaxPool < 1 {
		bad("TransportMaxPool = %d, want ≥ 1", c.TransportMaxPool)
	}
	if c.DiskCheckInterval < 10*time.Millisecond {
		bad("DiskCheckInterval %v < 10ms", c.DiskCheckInterval)
	}
	if c.HandshakeTimeout < 0 {
		bad("HandshakeTimeout %v < 0", c.HandshakeTimeout)
	}
	if c.MaxPendingConns < 0 {
		bad("MaxPendingConns %d < 0", c.MaxPendingConns)
	}
	if (c.ServerTLS == nil) != (c.ClientTLS == nil) {
		bad("ServerTLS and ClientTLS must be set together (all nodes speak TLS on the raft port, or none does)")
	}

	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RaftLogLevel == nil {
		c.RaftLogLevel = slog.LevelWarn
	}

	if len(errs) == 0 {
		// Belt and braces: raft's own checks on the config we will build.
		rc := c.raftConfig()
		if err := raft.ValidateConfig(rc); err != nil {
			bad("%v", err)
		}
	}
	return errors.Join(errs...)
}

// raftConfig builds a group's raft configuration (without NotifyCh/Logger).
func (c *Config) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = c.CommitTimeout
	rc.MaxAppendEntries = c.MaxAppendEntries
	rc.SnapshotInterval = c.SnapshotInterval
	rc.SnapshotThreshold = c.SnapshotThreshold
	rc.TrailingLogs = c.TrailingLogs
	// Buffer the apply channel (MaxAppendEntries deep) so Apply calls from
	// the server's pipelined leader path do not wait for the leader loop to
	// finish its current disk write. Apply's enqueue timeout then rarely
	// matters; commit is still awaited through the future.
	rc.BatchApplyCh = true
	// Pre-vote stays enabled (raft's default): a node rejoining after a
	// partition does not depose a healthy leader.
	rc.NoLegacyTelemetry = true
	// A leader that commits its own removal steps down and stays a follower
	// instead of shutting its raft down (raft's default). Shut down, the
	// replica closes its transport and can never serve again until the process
	// restarts: re-adding the node would then count a dead voter towards
	// quorum. As a follower outside the configuration it cannot start an
	// election, and a leader that adds it back reaches it at once.
	rc.ShutdownOnRemove = false
	return rc
}
