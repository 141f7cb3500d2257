package ratelimit

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// ownerCounts is what the owner's metrics report after a tick.
type ownerCounts struct {
	owned, blocked int
	// limited: owned tenants whose clients asked for more than the limit
	// left in the last tick; their sliding-window rate (as reported by the
	// clients) and their limits, summed, in requests per second.
	limited                   int
	limitedRate, limitedLimit float64
}

// counts returns the tenants owned, blocked and limited (tick goroutine
// only, or after it stopped).
func (o *Owner) counts(ns int64) ownerCounts {
	var c ownerCounts
	for k := range o.shards {
		o.shards[k].mu.Lock()
		o.shards[k].countInto(&c, ns)
		o.shards[k].mu.Unlock()
	}
	return c
}

// countInto adds the shard's tenants to c (sh.mu held).
func (sh *shard) countInto(c *ownerCounts, ns int64) {
	for _, t := range sh.list {
		if !t.owned {
			continue
		}
		c.owned++
		if t.blockedTil > ns {
			c.blocked++
		}
		if t.scarce && t.rate > 0 && t.window > 0 && !math.IsInf(t.rate, 1) {
			span := float64(t.window) / 1e9
			curAge := min(max(float64(ns-t.curStart)/1e9, 0), span)
			c.limited++
			c.limitedRate += (t.prev*((span-curAge)/span) + t.cur) / span
			c.limitedLimit += t.rate
		}
	}
}

// Collector exports the owner's state for Prometheus.
func (s *Service) Collector() prometheus.Collector { return &collector{s: s} }

var (
	descOwned    = prometheus.NewDesc("tollgate_ratelimit_owner_tenants", "Tenants whose rate state this node owns (leads their rate group).", nil, nil)
	descBlocked  = prometheus.NewDesc("tollgate_ratelimit_owner_blocklist_size", "Owned tenants over their limit now (sliding-window rate above the limit).", nil, nil)
	descSessions = prometheus.NewDesc("tollgate_ratelimit_owner_streams", "Open client rate-report streams.", nil, nil)
	descReports  = prometheus.NewDesc("tollgate_ratelimit_owner_reports_total", "Rate reports absorbed.", nil, nil)
	descRejected = prometheus.NewDesc("tollgate_ratelimit_owner_invalid_streams_total", "Streams ended because a report was invalid.", nil, nil)
	descTick     = prometheus.NewDesc("tollgate_ratelimit_owner_tick_seconds", "Duration of the last tick (fold reports, build updates).", nil, nil)
	descLimited  = prometheus.NewDesc("tollgate_ratelimit_owner_limited_tenants", "Owned tenants whose clients asked for more than their limit in the last tick.", nil, nil)
	descLimRate  = prometheus.NewDesc("tollgate_ratelimit_owner_limited_admitted_per_second", "Sliding-window rate admitted for the limited tenants (as their clients report it), summed: compare with tollgate_ratelimit_owner_limited_limit_per_second.", nil, nil)
	descHandoffs = prometheus.NewDesc("tollgate_ratelimit_owner_handoffs_total", "Sliding-window keys a raise moved here whose previous owner handed their window over.", nil, nil)
	descHandMiss = prometheus.NewDesc("tollgate_ratelimit_owner_handoffs_missed_total", "Sliding-window keys a raise moved here whose hand-off did not come within a second (rebuilt from the clients' reports instead).", nil, nil)
	descLimLimit = prometheus.NewDesc("tollgate_ratelimit_owner_limited_limit_per_second", "Rate limits of the limited tenants, summed.", nil, nil)
)

type collector struct{ s *Service }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOwned, descBlocked, descSessions, descReports, descRejected, descTick, descLimited, descLimRate, descLimLimit, descHandoffs, descHandMiss} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, float64(s.owned.Load()))
	ch <- prometheus.MustNewConstMetric(descBlocked, prometheus.GaugeValue, float64(s.blocked.Load()))
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.sessions.Load()))
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(s.reports.Load()))
	ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(s.rejected.Load()))
	ch <- prometheus.MustNewConstMetric(descTick, prometheus.GaugeValue, float64(s.tickNanos.Load())/1e9)
	ch <- prometheus.MustNewConstMetric(descLimited, prometheus.GaugeValue, float64(s.limited.Load()))
	ch <- prometheus.MustNewConstMetric(descLimRate, prometheus.GaugeValue, math.Float64frombits(s.limitedRate.Load()))
	ch <- prometheus.MustNewConstMetric(descLimLimit, prometheus.GaugeValue, math.Float64frombits(s.limitedLimit.Load()))
	ch <- prometheus.MustNewConstMetric(descHandoffs, prometheus.CounterValue, float64(s.o.handoffs.Load()))
	ch <- prometheus.MustNewConstMetric(descHandMiss, prometheus.CounterValue, float64(s.o.handoffsMissed.Load()))
}
