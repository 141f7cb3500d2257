package partitionlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultWindowMinutes = api.DefaultHLLWindowMinutes // the nodes' default too
	DefaultPushInterval  = time.Second
	DefaultRPCTimeout    = 2 * time.Second
	DefaultPartitions    = 4096
	// DefaultReconnectMax caps the wait between attempts to reopen the watch
	// stream after every node failed.
	DefaultReconnectMax = 2 * time.Second
	// DefaultResubscribeEvery is the least time between two subscriptions
	// of the watch stream when the tenants checked here grow.
	DefaultResubscribeEvery = time.Second
)

// Limits gives a tenant's max_series_per_partition (0 or less: no limit, the
// default). It is called on every Check, so it must be cheap and safe for
// concurrent use; the runtime-config source feeds it.
type Limits interface {
	MaxSeriesPerPartition(tenant string) int64
}

// LimitsFunc adapts a function to Limits.
type LimitsFunc func(tenant string) int64

// MaxSeriesPerPartition calls f.
func (f LimitsFunc) MaxSeriesPerPartition(tenant string) int64 { return f(tenant) }

// Config configures a Limiter.
type Config struct {
	// Precision p: 2^p registers per sketch, 4..18; 0 = 11 (2048 registers,
	// 2 KiB per minute sketch, ±2.3% standard error). Every client and node of
	// a cluster must use the same precision (a node refuses the others).
	Precision int
	// WindowMinutes is the sliding window; 0 = 20. Must match the nodes'.
	WindowMinutes int
	// Partitions bounds ingest partition numbers: 0 ≤ partition < Partitions;
	// 0 = 4096 (the nodes' default --sketch-partitions).
	Partitions int
	// Limits supplies max_series_per_partition; nil = no tenant is limited.
	Limits Limits

	// Addrs are gRPC addresses of Tollgate nodes. Empty: local only (each
	// client counts only what it sees itself).
	Addrs []string
	// PushInterval is how often changed registers are pushed; 0 = 1s.
	PushInterval time.Duration
	// RPCTimeout bounds one push; 0 = 2s.
	RPCTimeout time.Duration
	// ReconnectMax caps the backoff between watch reconnects; 0 = 2s.
	ReconnectMax time.Duration
	// ResubscribeEvery is the least time between two re-subscriptions of the
	// watch stream: the stream carries only the sketches of tenants checked
	// here, and is opened again (at most this often) when a new one is
	// checked; until then the new tenant is decided on local sketches only.
	// 0 = 1s.
	ResubscribeEvery time.Duration
	// DialOptions are added to every connection (TLS, interceptors…).
	DialOptions []grpc.DialOption
	// Token is the bearer token sent with every call, for clusters with
	// credentials: sketch pushes and the sketch stream need the track
	// scope, limited to the tenants this process pushes if the operator
	// chose so. Empty: no token (the dev default).
	Token string

	// Clock is the wall clock (tests inject one); nil = time.Now.
	Clock  func() time.Time
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Precision == 0 {
		c.Precision = api.DefaultHLLPrecision
	}
	if err := api.ValidateHLLPrecision(c.Precision); err != nil {
		return fmt.Errorf("partitionlimit: %w", err)
	}
	if c.WindowMinutes == 0 {
		c.WindowMinutes = DefaultWindowMinutes
	}
	if c.WindowMinutes < 1 || c.WindowMinutes > 24*60 {
		return fmt.Errorf("partitionlimit: window %d minutes: must be in [1, 1440]", c.WindowMinutes)
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Partitions < 1 || c.Partitions > 1<<31-1 {
		return fmt.Errorf("partitionlimit: partitions %d: must be ≥ 1", c.Partitions)
	}
	if c.PushInterval < 0 || c.RPCTimeout < 0 || c.ReconnectMax < 0 || c.ResubscribeEvery < 0 {
		return errors.New("partitionlimit: push interval, RPC timeout, reconnect max and resubscribe interval must be ≥ 0")
	}
	if c.ResubscribeEvery == 0 {
		c.ResubscribeEvery = DefaultResubscribeEvery
	}
	if c.PushInterval == 0 {
		c.PushInterval = DefaultPushInterval
	}
	if c.RPCTimeout == 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	c.Addrs = slices.Clone(c.Addrs)
	c.DialOptions = slices.Clone(c.DialOptions)
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
