package clientlib

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/limits"
)

// RuntimeConfig is one version of the cluster's replicated runtime
// configuration as the client received it on its WatchCluster stream. It is
// immutable; the accessors apply the inheritance rules (a tenant's own value,
// else the defaults', else "off": 0 for limits, 100 for sample percentages).
// The server's --default-max-series is not part of the document, so
// MaxSeries is only what the document sets.
type RuntimeConfig struct {
	pb *api.RuntimeConfig
}

// Version is the configuration's version; 0 when the cluster has none
// replicated (yet, or below cluster version 3).
func (r *RuntimeConfig) Version() uint64 { return r.pb.GetVersion() }

// Proto is the configuration's wire form; callers must not modify it.
func (r *RuntimeConfig) Proto() *api.RuntimeConfig { return r.pb }

// TenantLimits are a tenant's effective limits from the document (package
// limits): MaxSeries 0 = not set here (the server's default applies);
// MaxSeriesPerPartition, IngestionRate (tokens per second) 0 = off.
type TenantLimits = limits.Effective

// Tenant returns a tenant's effective limits: the defaults, overlaid by the
// tenant's own scope (limits.Resolve, the rule the servers apply), over an
// empty base since the server's --default-max-series is not in the document.
func (r *RuntimeConfig) Tenant(tenant string) TenantLimits {
	return limits.Resolve(limits.Effective{}, overrides(r.pb.GetDefaults()), overrides(r.pb.GetTenants()[tenant]))
}

// overrides are the limit keys a scope of the wire document sets.
func overrides(s *api.TenantLimits) limits.Overrides {
	if s == nil {
		return limits.Overrides{}
	}
	return limits.Overrides{MaxSeries: s.MaxSeries, MaxSeriesPerPartition: s.MaxSeriesPerPartition,
		IngestionRate: s.IngestionRate, IngestionBurst: s.IngestionBurst}
}

// IngestionRate is the tenant's rate limit (tokens/s, 0 = off) and burst: the
// shape of the function the rate limiter reads limits through.
func (r *RuntimeConfig) IngestionRate(tenant string) (rate float64, burst int64) {
	t := r.Tenant(tenant)
	return t.IngestionRate, t.IngestionBurst
}

// MaxSeriesPerPartition is the tenant's per-partition series limit (0 = off).
func (r *RuntimeConfig) MaxSeriesPerPartition(tenant string) int64 {
	return r.Tenant(tenant).MaxSeriesPerPartition
}

// SampleRate is the key's (tenant's) percent for a kind: its own, else the
// defaults', else 100. Multiply by GlobalSampleRate for the fraction sampled.
func (r *RuntimeConfig) SampleRate(key, kind string) float64 {
	if p, ok := r.pb.GetTenants()[key].GetSampleRates()[kind]; ok {
		return p
	}
	if p, ok := r.pb.GetDefaults().GetSampleRates()[kind]; ok {
		return p
	}
	return 100
}

// GlobalSampleRate is the global percent for a kind (100 when unset).
func (r *RuntimeConfig) GlobalSampleRate(kind string) float64 {
	if p, ok := r.pb.GetGlobal().GetSampleRates()[kind]; ok {
		return p
	}
	return 100
}

// BacklogController is the backlog controller's configuration, nil when none.
func (r *RuntimeConfig) BacklogController() *api.BacklogController {
	return r.pb.GetGlobal().GetBacklogController()
}

// runtimeConfigState holds the newest configuration and the subscribers.
type runtimeConfigState struct {
	cur atomic.Pointer[RuntimeConfig]

	mu     sync.Mutex // serialises deliveries and the subscriber list
	nextID int
	subs   map[int]func(*RuntimeConfig)
}

// RuntimeConfig returns the newest runtime configuration received (never
// nil; Version 0 before any). Lock-free: cheap enough for hot paths, though
// consumers that decide per item should keep their own derived tables and
// refresh them from OnRuntimeConfig.
func (c *Client) RuntimeConfig() *RuntimeConfig {
	if r := c.rcfg.cur.Load(); r != nil {
		return r
	}
	return &RuntimeConfig{pb: &api.RuntimeConfig{}}
}

// OnRuntimeConfig calls fn with the current configuration (if one was
// received) and then with every newer one, in version order, from the
// client's watch goroutine: fn must return quickly. The returned function
// unsubscribes. Versions only move forward: a view from a node holding an
// older version (it reconnected to a lagging node) is ignored.
func (c *Client) OnRuntimeConfig(fn func(*RuntimeConfig)) (unsubscribe func()) {
	st := &c.rcfg
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.subs == nil {
		st.subs = map[int]func(*RuntimeConfig){}
	}
	id := st.nextID
	st.nextID++
	st.subs[id] = fn
	if r := st.cur.Load(); r != nil {
		fn(r)
	}
	return func() {
		st.mu.Lock()
		delete(st.subs, id)
		st.mu.Unlock()
	}
}

// applyRuntimeConfig takes the configuration of a cluster view (whole, or a
// delta from the version held) if it is newer than the one held, and tells
// the subscribers. It fails only for a delta from a version it does not hold.
func (c *Client) applyRuntimeConfig(v *api.ClusterView) error {
	d := v.GetRuntimeConfigDelta()
	if v.GetConfigVersion() == 0 || (v.GetRuntimeConfig() == nil && d == nil) {
		return nil
	}
	st := &c.rcfg
	st.mu.Lock()
	defer st.mu.Unlock()
	cur := st.cur.Load()
	if cur != nil && cur.Version() >= v.ConfigVersion {
		return nil
	}
	pb := v.GetRuntimeConfig()
	if pb == nil {
		if cur == nil {
			return fmt.Errorf("runtime config delta from version %d to %d, and no config held", d.GetBaseVersion(), d.GetVersion())
		}
		next, err := api.ApplyConfigDelta(cur.pb, d)
		if err != nil {
			return err
		}
		pb = next
	}
	r := &RuntimeConfig{pb: pb}
	st.cur.Store(r)
	c.stats.configUpdates.Add(1)
	for _, fn := range st.subs {
		fn(r)
	}
	return nil
}

// MaxSeriesPerPartition is the tenant's max_series_per_partition in the
// newest runtime configuration received (0 = off). Unlike
// RuntimeConfig().MaxSeriesPerPartition, which reads one fixed version, it
// follows every change, so a Client can be handed as is to consumers that
// read limits through a `MaxSeriesPerPartition(tenant) int64` interface
// (partitionlimit.Config.Limits) with no glue code.
func (c *Client) MaxSeriesPerPartition(tenant string) int64 {
	return c.RuntimeConfig().MaxSeriesPerPartition(tenant)
}
