package api

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
)

// ConfigDelta returns what turns runtime config base into next: next's
// defaults and global settings whole, the tenants added or changed, the
// tenants removed (sorted). Its cost is one comparison per tenant, paid once
// per version by the serving node; the delta's size is the change's.
func ConfigDelta(base, next *RuntimeConfig) *RuntimeConfigDelta {
	d := &RuntimeConfigDelta{
		BaseVersion: base.GetVersion(), Version: next.GetVersion(),
		Defaults: next.GetDefaults(), Global: next.GetGlobal(),
	}
	for name, tl := range next.GetTenants() {
		if old, ok := base.GetTenants()[name]; !ok || !proto.Equal(old, tl) {
			if d.Tenants == nil {
				d.Tenants = map[string]*TenantLimits{}
			}
			d.Tenants[name] = tl
		}
	}
	for name := range base.GetTenants() {
		if _, ok := next.GetTenants()[name]; !ok {
			d.RemovedTenants = append(d.RemovedTenants, name)
		}
	}
	slices.Sort(d.RemovedTenants)
	return d
}

// ApplyConfigDelta returns base with d applied, as a new config (base is not
// changed; unchanged tenants are shared with it, so treat both as read-only).
// It refuses a delta whose base version is not base's.
func ApplyConfigDelta(base *RuntimeConfig, d *RuntimeConfigDelta) (*RuntimeConfig, error) {
	if d.GetBaseVersion() != base.GetVersion() {
		return nil, fmt.Errorf("config delta from version %d to %d: this config is version %d", d.GetBaseVersion(), d.GetVersion(), base.GetVersion())
	}
	if d.GetVersion() <= d.GetBaseVersion() {
		return nil, fmt.Errorf("config delta from version %d to %d: the version must increase", d.GetBaseVersion(), d.GetVersion())
	}
	out := &RuntimeConfig{Version: d.Version, Defaults: d.Defaults, Global: d.Global, Envoy: base.GetEnvoy()}
	if n := len(base.GetTenants()) + len(d.GetTenants()) - len(d.GetRemovedTenants()); n > 0 {
		out.Tenants = make(map[string]*TenantLimits, n)
		maps.Copy(out.Tenants, base.GetTenants())
		maps.Copy(out.Tenants, d.GetTenants())
		for _, name := range d.GetRemovedTenants() {
			delete(out.Tenants, name)
		}
	}
	return out, nil
}
