package clientlib

import (
	"maps"

	"github.com/tollgate-io/tollgate/clientlib/sampling"
)

// SamplingRates converts the configuration's sample rates (global, defaults
// and per-tenant, with the configuration's version) into the snapshot a
// sampling.Sampler takes. Tenants without sample rates are left out (they
// inherit the defaults).
func (r *RuntimeConfig) SamplingRates() sampling.Rates {
	pb := r.pb
	out := sampling.Rates{
		Version: pb.GetVersion(),
		Global:  maps.Clone(pb.GetGlobal().GetSampleRates()),
		Default: maps.Clone(pb.GetDefaults().GetSampleRates()),
	}
	for tenant, t := range pb.GetTenants() {
		if len(t.GetSampleRates()) == 0 {
			continue
		}
		if out.Keys == nil {
			out.Keys = map[string]map[string]float64{}
		}
		out.Keys[tenant] = maps.Clone(t.SampleRates)
	}
	return out
}

// FeedSampler keeps s up to date with the cluster's sample rates: it updates
// s with the current configuration (if one was received) and with every newer
// version, from the client's watch stream, so s.ShouldSample decides locally
// from the replicated rates. The returned function stops the feed.
//
// The replicated config checks kinds with the samplers' rule narrowed
// (runtimecfg.ValidateKind: sampleconf.ValidateKind, lower case only), so a
// sampler takes every version the cluster accepts. A version it refuses all
// the same (stale: older than the version in force, or that version with
// other rates; or rules that differ in the client's release) leaves the
// previous rates in force; it is logged on the client's Logger, counted in the
// sampler's refused updates (tollgate_client_sample_config_updates_total
// {result="refused"}), and passed to onError when it is not nil.
func (c *Client) FeedSampler(s *sampling.Sampler, onError func(version uint64, err error)) (stop func()) {
	return c.OnRuntimeConfig(func(r *RuntimeConfig) {
		if r.Version() == 0 {
			return
		}
		if err := s.Update(r.SamplingRates()); err != nil {
			c.log.Warn("sampling: runtime config version refused by the sampler; previous rates stay in force", "version", r.Version(), "err", err)
			if onError != nil {
				onError(r.Version(), err)
			}
		}
	})
}
