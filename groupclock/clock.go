package groupclock

import (
	"sync"
	"time"
)

// Config configures a Clock.
type Config struct {
	// Wall is the node's wall clock, ideally corrected by its measured offset
	// to the cluster (default time.Now).
	Wall func() time.Time
	// Mono is the monotonic source: only differences of its readings are used
	// (default time.Now, whose readings carry Go's monotonic clock).
	Mono func() time.Time
	// Bound is the largest offset between node clocks the cluster tolerates:
	// how far ahead of its estimate an untrusted leader may move the group's
	// time.
	Bound time.Duration
	// Trusted reports whether Wall is known to agree with the cluster's
	// clocks (nil: never): the node measured its offset to a majority of its
	// peers and is within Bound of their median, which Wall is corrected by.
	// A trusted leader stamps Wall whenever it is ahead of its estimate (so
	// a group whose time lags real time, e.g. after a full restart, catches
	// up); an untrusted one moves the time at most Bound ahead of it.
	Trusted func() bool
}

// Clock is one group's time as seen from one node. Safe for concurrent use.
type Clock struct {
	cfg Config

	mu      sync.Mutex
	have    bool  // an observation was made
	est     int64 // group time (Unix ms) at estAt: a lower bound
	estAt   time.Time
	leading bool
	base    int64     // the estimate when leadership began (Unix ms)
	baseAt  time.Time // its mono reading; zero: no estimate then
	last    int64     // highest time observed or returned
}

// New returns a clock with no observation yet.
func New(cfg Config) *Clock {
	if cfg.Wall == nil {
		cfg.Wall = time.Now
	}
	if cfg.Mono == nil {
		cfg.Mono = time.Now
	}
	return &Clock{cfg: cfg}
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// estimateLocked is the group's time at mono reading now.
func (c *Clock) estimateLocked(now time.Time) int64 {
	return c.est + ms(now.Sub(c.estAt))
}

// Observe records that an entry stamped with time t (Unix ms) was applied
// here. A minute-stamped entry is observed as the minute's start: a lower
// bound of the time it was stamped at.
func (c *Clock) Observe(t int64) {
	now := c.cfg.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.have:
		c.have, c.est, c.estAt = true, t, now
	case t > c.estimateLocked(now):
		c.est, c.estAt = t, now
	}
	c.last = max(c.last, t)
}

// SetLeader is called when this node starts or stops leading the group,
// before it stamps anything as leader.
func (c *Clock) SetLeader(leading bool) {
	now := c.cfg.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !leading {
		c.leading = false
		return
	}
	if c.leading {
		return
	}
	c.leading = true
	c.baseAt = time.Time{}
	if c.have {
		c.base, c.baseAt = c.estimateLocked(now), now
	}
}

// Now returns the group's time in Unix ms: on the leader the time to stamp,
// on a follower its best estimate. It never returns less than an earlier
// answer or an observed time.
func (c *Clock) Now() int64 {
	now := c.cfg.Mono()
	wall := c.cfg.Wall().UnixMilli()
	trusted := c.cfg.Trusted != nil && c.cfg.Trusted()
	bound := ms(c.cfg.Bound)
	c.mu.Lock()
	defer c.mu.Unlock()
	var t int64
	switch {
	case !c.have:
		// Nothing applied here yet (a new group): the wall clock is all
		// there is.
		t = wall
	case c.leading && c.baseAt != (time.Time{}):
		b := c.base + ms(now.Sub(c.baseAt))
		lo := max(b, c.estimateLocked(now))
		hi := b + bound
		if trusted {
			hi = max(hi, wall)
		}
		t = clamp(wall, lo, max(lo, hi))
	default:
		e := c.estimateLocked(now)
		hi := e + bound
		if trusted {
			hi = max(hi, wall)
		}
		t = clamp(wall, e, hi)
	}
	t = max(t, c.last)
	c.last = t
	return t
}

// Estimate returns the group's time as observed here, without the wall
// clock: the latest observed time extended by monotonic time (0: nothing
// observed).
func (c *Clock) Estimate() int64 {
	now := c.cfg.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		return 0
	}
	return c.estimateLocked(now)
}

func clamp(v, lo, hi int64) int64 {
	return min(max(v, lo), hi)
}
