package metering

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/metering/interval"
	"github.com/tollgate-io/tollgate/nodeport"
)

// DefaultSlack is the default slack window: events may be up to about two
// months in the past or future.
const DefaultSlack = 62 * 24 * time.Hour

// DefaultMaxFuture is the default bound on a timestamp ahead of the
// node's clock.
const DefaultMaxFuture = time.Hour

// Config configures metering on a node.
type Config struct {
	Granularity interval.Granularity // default Hour
	Location    *time.Location       // default UTC
	Slack       time.Duration        // default DefaultSlack
	// MaxFuture bounds how far ahead of the node's metering clock an
	// event's timestamp may be (default DefaultMaxFuture): a client clock
	// is off by seconds, not days, and an event far ahead would open a
	// span that bills from a time that has not come. Not applied with
	// TestClock.
	MaxFuture time.Duration
	// SinkURL, when set, receives every usage record as a JSON POST (the
	// HTTP collector sink); the ledger always receives them.
	SinkURL     string
	SinkTimeout time.Duration // per call; default 5s
	// SinkConcurrency bounds the sink calls in flight per group; default 64.
	SinkConcurrency int
	// LedgerRetention drops ledger records and series samples older than
	// this (by their timestamp); default 400 days.
	LedgerRetention time.Duration
	// TestClock lets the admin API set and advance this node's metering
	// clock (development and tests only; refused otherwise).
	TestClock bool
	MaxBody   int64 // request body bound; default 64 KiB
	// BatchMax bounds events per raft entry; default 4096.
	BatchMax   int
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c *Config) validate() error {
	if c.Granularity == 0 {
		c.Granularity = interval.Hour
	}
	if !c.Granularity.Valid() {
		return fmt.Errorf("metering config: granularity %d", c.Granularity)
	}
	if c.Location == nil {
		c.Location = time.UTC
	}
	if c.Slack == 0 {
		c.Slack = DefaultSlack
	}
	if c.MaxFuture == 0 {
		c.MaxFuture = DefaultMaxFuture
	}
	if c.MaxFuture < 0 {
		return fmt.Errorf("metering config: max future %v: must be positive", c.MaxFuture)
	}
	if c.Slack < time.Second {
		return fmt.Errorf("metering config: slack %v: must be at least 1s", c.Slack)
	}
	if c.SinkTimeout == 0 {
		c.SinkTimeout = 5 * time.Second
	}
	if c.SinkConcurrency == 0 {
		c.SinkConcurrency = 64
	}
	if c.LedgerRetention == 0 {
		c.LedgerRetention = 400 * 24 * time.Hour
	}
	if c.MaxBody == 0 {
		c.MaxBody = 64 << 10
	}
	if c.BatchMax == 0 {
		c.BatchMax = 4096
	}
	if c.BatchMax > fsmmeter.MaxBatch {
		c.BatchMax = fsmmeter.MaxBatch
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// Host is what the node offers metering: the node's port (groups,
// leadership, versioned proposals, the leader's connection) and the
// metering state and inputs of each group.
type Host interface {
	nodeport.Port
	// GroupOf returns the group holding a target hash's metering: its
	// partition's owner in the layout table (the created count's
	// arithmetic until every member can move metering).
	GroupOf(hash uint64) int
	// HomeOf returns the group the created count's arithmetic gives a
	// target hash: where its metering stays when a build without metering
	// moves handed its partition's series on.
	HomeOf(hash uint64) int
	Module(g int) *fsmmeter.Module
	// TenantsActive lists every tenant's active series in group g.
	TenantsActive(g int) []fsmmeter.TenantActive
}

// ErrClockLocked is returned when the clock is changed on a node not started
// with the test clock.
var ErrClockLocked = errors.New("metering clock: this node was not started with the metering test clock (--metering-test-clock); refusing to change it")

// ErrClockBackwards is returned for a negative advance.
var ErrClockBackwards = errors.New("metering clock: cannot move backwards (advance must be ≥ 0)")

// Clock is metering's one clock: the sampler, the slack check (through the
// time stamped in entries) and ledger retention read it. In test mode it can
// be set and advanced; once set it stands still except when advanced, so a
// test controls it fully.
type Clock struct {
	wall     func() time.Time
	testMode bool
	mu       sync.Mutex
	fixed    bool
	at       int64
	changed  chan struct{}
	group    func(g int) int64 // SetGroupTime; nil: the wall clock
}

// NewClock returns a clock reading wall (default time.Now).
func NewClock(wall func() time.Time, testMode bool) *Clock {
	if wall == nil {
		wall = time.Now
	}
	return &Clock{wall: wall, testMode: testMode, changed: make(chan struct{})}
}

// Now is the current time in Unix ms.
func (c *Clock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fixed {
		return c.at
	}
	return c.wall().UnixMilli()
}

// SetGroupTime makes fn the source of each group's time (Unix ms) for
// NowIn: the node's group clocks, which no leader's wall clock moves by more
// than the cluster's clock bound. Call it before the service starts.
func (c *Clock) SetGroupTime(fn func(g int) int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.group = fn
}

// NowIn is group g's time in Unix ms: what entries of g are stamped with, so
// the slack check, dedup windows and sampler boundaries of a group all read
// one clock whichever node leads it. A test clock that was set wins.
func (c *Clock) NowIn(g int) int64 {
	c.mu.Lock()
	fixed, at, group := c.fixed, c.at, c.group
	c.mu.Unlock()
	switch {
	case fixed:
		return at
	case group != nil:
		return group(g)
	}
	return c.wall().UnixMilli()
}

// Set fixes the clock at ms (test mode only).
func (c *Clock) Set(ms int64) error {
	return c.change(func() { c.fixed, c.at = true, ms })
}

// Advance moves the clock forward by d (test mode only); a clock not set yet
// is fixed at the wall time first.
func (c *Clock) Advance(d time.Duration) error {
	if d < 0 {
		return ErrClockBackwards
	}
	return c.change(func() {
		if !c.fixed {
			c.fixed, c.at = true, c.wall().UnixMilli()
		}
		c.at += d.Milliseconds()
	})
}

func (c *Clock) change(f func()) error {
	if !c.testMode {
		return ErrClockLocked
	}
	c.mu.Lock()
	f()
	ch := c.changed
	c.changed = make(chan struct{})
	c.mu.Unlock()
	close(ch)
	return nil
}

// Changed is closed at the next Set or Advance (the sampler wakes on it).
func (c *Clock) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}
