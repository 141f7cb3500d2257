package gctune

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Config bounds the tuning. Zero values take the defaults noted.
type Config struct {
	// Headroom is the garbage a heap may gather between collections once it
	// is large: the percentage becomes 100·Headroom/live. Default 128 MiB.
	Headroom uint64
	// MinPercent and MaxPercent clamp the percentage. Defaults 10 and 100.
	MinPercent, MaxPercent int
	// Every is how often the live heap is read. Default 1s.
	Every  time.Duration
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Headroom == 0 {
		c.Headroom = 128 << 20
	}
	if c.MinPercent == 0 {
		c.MinPercent = 10
	}
	if c.MaxPercent == 0 {
		c.MaxPercent = 100
	}
	if c.Every == 0 {
		c.Every = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.MinPercent < 1:
		return fmt.Errorf("gctune: MinPercent %d: must be ≥ 1", c.MinPercent)
	case c.MaxPercent < c.MinPercent:
		return fmt.Errorf("gctune: MaxPercent %d < MinPercent %d", c.MaxPercent, c.MinPercent)
	case c.Every < 0:
		return fmt.Errorf("gctune: Every %v: must be > 0", c.Every)
	}
	return nil
}

// Percent is the collector percentage for a live heap of live bytes.
func (c Config) Percent(live uint64) int {
	if live == 0 {
		return c.MaxPercent
	}
	p := c.Headroom * 100 / live
	switch {
	case p >= uint64(c.MaxPercent):
		return c.MaxPercent
	case p <= uint64(c.MinPercent):
		return c.MinPercent
	}
	return int(p)
}

// liveMetric is the heap the last collection found reachable.
const liveMetric = "/gc/heap/live:bytes"

// Run tunes the collector until ctx ends, unless the process runs with GOGC
// set (then it returns at once, leaving the operator's choice). It restores
// the percentage it found when it returns.
func Run(ctx context.Context, c Config) error {
	if err := c.validate(); err != nil {
		return err
	}
	if v := os.Getenv("GOGC"); v != "" { // empty is the runtime's default too
		c.Logger.Info("GC tuning off: GOGC is set", "gogc", v)
		return nil
	}
	sample := []metrics.Sample{{Name: liveMetric}}
	cur := debug.SetGCPercent(c.MaxPercent)
	defer debug.SetGCPercent(cur)
	cur = c.MaxPercent
	t := time.NewTicker(c.Every)
	defer t.Stop()
	for {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live := sample[0].Value.Uint64()
			if p := c.Percent(live); p != cur {
				debug.SetGCPercent(p)
				c.Logger.Debug("GC percent changed", "percent", p, "live_heap_mb", live>>20)
				cur = p
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
