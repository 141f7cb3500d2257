package clientlib

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
)

// Mode chooses when TrackSeries waits for the leaders' answers.
type Mode int

const (
	// ModeAuto (the default) waits for the answer (sync) for the groups where the
	// tenant is near its limit, or where the client does not know yet, and waits
	// at most Config.AsyncWait (async) for the other groups.
	ModeAuto Mode = iota
	// ModeSync always waits for every answer: rejections are exact, latency is
	// one raft commit.
	ModeSync
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeSync:
		return "sync"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults applied by New to zero Config fields.
const (
	DefaultTimeout          = 10 * time.Second
	DefaultRetryInitial     = 10 * time.Millisecond
	DefaultRetryMax         = time.Second
	DefaultNearLimitRefresh = time.Second
	DefaultAsyncWait        = 5 * time.Millisecond
	DefaultAsyncTimeout     = 2 * time.Second
	DefaultAttemptTimeout   = 2 * time.Second
	// DefaultWatchReprobe is how long the client waits before asking again for
	// a WatchCluster stream after a node answered Unimplemented.
	DefaultWatchReprobe = 30 * time.Second
)

// Config configures a Client. Every zero field takes the default named in its
// comment; New rejects negative durations and an invalid layout.
type Config struct {
	// Addrs are seed gRPC addresses of Tollgate nodes (required, at least one).
	// The client opens its WatchCluster stream to one of them and then also
	// uses every member the cluster view lists.
	Addrs []string

	// Partitions and Groups are the cluster layout (P and G). 0 = learn them from
	// the first ClusterView (calls wait for it, within their deadline). When
	// both are set, the first calls wait for the first WatchCluster outcome (at
	// most 1s, less if the stream fails), and a ClusterView that says otherwise
	// makes the client fail every call with a *LayoutError naming both
	// layouts. If the servers do not implement WatchCluster, a field left at 0
	// takes api.DefaultPartitions / api.DefaultGroups.
	Partitions int
	Groups     int

	// AttemptTimeout bounds one RPC attempt to one node; the call's deadline
	// (Timeout) bounds them all. A leader cut off by a network partition drops
	// packets instead of refusing them, so without this bound a request sent to
	// it waits for the whole deadline; with it, the client gives up on that node
	// after AttemptTimeout and retries through another one (re-sending is safe:
	// tracking is idempotent). A healthy leader answers within milliseconds and
	// one that lost its quorum fails pending writes within about a second, so
	// the default (2s) only cuts attempts that would not have answered.
	AttemptTimeout time.Duration

	// TLS, when set, secures every connection: RootCAs verifies the nodes
	// (nil: the system roots), Certificates is the client certificate for
	// clusters started with --tls-client-auth require. The server name is
	// each node's host as the cluster view advertises it, unless ServerName is
	// set. Nil: plaintext, unless DialOptions carry transport credentials.
	TLS *tls.Config

	// Token is the bearer token sent with every call, for clusters with
	// credentials (an admin token, or scoped credentials too): it needs the
	// track scope (tracking, the cluster and summary streams), limited to
	// the tenants this client tracks if the operator chose so; the admin
	// token satisfies every scope. Empty: no token (the dev default).
	Token string

	// DialOptions are added to every connection (interceptors, keepalive…);
	// transport credentials given here win over TLS.
	DialOptions []grpc.DialOption

	// Timeout is the deadline given to a TrackSeries or TrackPartition call whose
	// context has none (default 10s), so retries always end.
	Timeout time.Duration

	// RetryInitial and RetryMax bound the exponential backoff between re-sends
	// (defaults 10ms and 1s). Each wait is drawn uniformly from [d/2, d] (jitter);
	// d doubles after every wait up to RetryMax. A wait that would end after the
	// call's deadline is not taken: the call fails with its last error instead.
	RetryInitial time.Duration
	RetryMax     time.Duration

	// Mode is ModeAuto (default) or ModeSync.
	Mode Mode

	// NearLimitRefresh is the period at which the client asks, for every group,
	// which tenants are near their limit (GetUsersCloseToLimit; default 1s)
	// when the servers do not push summaries (WatchSummaries unimplemented). A
	// group's list older than 5 × NearLimitRefresh + AsyncTimeout is not
	// trusted: the group is then tracked sync.
	// Unused in ModeSync.
	NearLimitRefresh time.Duration

	// AsyncWait is how long TrackSeries waits for the answer of a group where the
	// tenant is far from its limit (default 5ms). If it has not come, that part
	// of the call returns no rejections and no error, and the request goes on in
	// the background.
	AsyncWait time.Duration

	// AsyncTimeout bounds how long such a background request keeps running,
	// retries included, counted from the start of the call (default 2s).
	AsyncTimeout time.Duration

	// FailOpen: when a partition's request fails because Tollgate could not
	// answer (Unavailable, DeadlineExceeded, no reachable leader, Internal…;
	// see IsFailOpenable) the call returns no rejections and no error for that
	// part and counts it in Stats.FailedOpen. When false (default) such a
	// failure is returned as a *PartitionError. Errors about the request itself
	// (InvalidArgument, ResourceExhausted, auth errors) are always returned.
	FailOpen bool

	// Logger receives the client's logs (default: discarded).
	Logger *slog.Logger

	// watchReprobe overrides DefaultWatchReprobe (tests).
	watchReprobe time.Duration
}

func (c *Config) validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("clientlib: Config.Addrs: at least one node address is required")
	}
	for i, a := range c.Addrs {
		if a == "" {
			return fmt.Errorf("clientlib: Config.Addrs[%d] is empty", i)
		}
	}
	if c.Partitions < 0 || c.Groups < 0 {
		return fmt.Errorf("clientlib: Config.Partitions = %d, Groups = %d: must be ≥ 0 (0 = learn from the cluster)", c.Partitions, c.Groups)
	}
	if c.Partitions > 0 && c.Groups > 0 {
		if err := api.ValidateLayout(c.Partitions, c.Groups, 1); err != nil {
			return fmt.Errorf("clientlib: Config: %w", err)
		}
	} else if c.Partitions > api.MaxPartitions {
		return fmt.Errorf("clientlib: Config.Partitions = %d: at most %d", c.Partitions, api.MaxPartitions)
	}
	if c.Mode != ModeAuto && c.Mode != ModeSync {
		return fmt.Errorf("clientlib: Config.Mode = %d: use ModeAuto or ModeSync", int(c.Mode))
	}
	durs := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"Timeout", &c.Timeout, DefaultTimeout},
		{"RetryInitial", &c.RetryInitial, DefaultRetryInitial},
		{"RetryMax", &c.RetryMax, DefaultRetryMax},
		{"NearLimitRefresh", &c.NearLimitRefresh, DefaultNearLimitRefresh},
		{"AsyncWait", &c.AsyncWait, DefaultAsyncWait},
		{"AsyncTimeout", &c.AsyncTimeout, DefaultAsyncTimeout},
		{"AttemptTimeout", &c.AttemptTimeout, DefaultAttemptTimeout},
		{"watchReprobe", &c.watchReprobe, DefaultWatchReprobe},
	}
	for _, d := range durs {
		if *d.d < 0 {
			return fmt.Errorf("clientlib: Config.%s = %v: must be ≥ 0 (0 = default %v)", d.name, *d.d, d.def)
		}
		if *d.d == 0 {
			*d.d = d.def
		}
	}
	if c.RetryMax < c.RetryInitial {
		return fmt.Errorf("clientlib: Config.RetryMax (%v) is below RetryInitial (%v)", c.RetryMax, c.RetryInitial)
	}
	if c.AsyncTimeout < c.AsyncWait {
		return fmt.Errorf("clientlib: Config.AsyncTimeout (%v) is below AsyncWait (%v)", c.AsyncTimeout, c.AsyncWait)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
