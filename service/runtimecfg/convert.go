package runtimecfg

import (
	"fmt"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
)

// ToProto converts a document to its wire form.
func ToProto(d *runtimecfg.Document) *api.RuntimeConfig {
	out := &api.RuntimeConfig{Version: d.Version, Defaults: scopeToProto(&d.Defaults), Global: &api.GlobalConfig{SampleRates: d.Global.SampleRates}}
	if len(d.Tenants) > 0 {
		out.Tenants = make(map[string]*api.TenantLimits, len(d.Tenants))
		for n, s := range d.Tenants {
			out.Tenants[n] = scopeToProto(&s)
		}
	}
	if bc := d.Global.BacklogController; bc != nil {
		out.Global.BacklogController = &api.BacklogController{Kind: bc.Kind, Target: bc.Target, PeriodMs: uint64(bc.Period / time.Millisecond),
			Kp: bc.Kp, Ki: bc.Ki, MinPercent: bc.MinPercent}
	}
	if len(d.Envoy) > 0 {
		out.Envoy = make(map[string]string, len(d.Envoy))
		for dom, c := range d.Envoy {
			out.Envoy[dom] = string(envoyrl.Render(c, ""))
		}
	}
	return out
}

func scopeToProto(s *runtimecfg.Scope) *api.TenantLimits {
	return &api.TenantLimits{MaxSeries: s.MaxSeries, MaxSeriesPerPartition: s.MaxSeriesPerPartition,
		IngestionRate: s.IngestionRate, IngestionBurst: s.IngestionBurst, SampleRates: s.SampleRates}
}

// FromProto converts the wire form to a document and validates it; errors
// are *runtimecfg.FieldError naming the field.
func FromProto(c *api.RuntimeConfig) (*runtimecfg.Document, error) {
	d := &runtimecfg.Document{Version: c.GetVersion(), Defaults: scopeFromProto(c.GetDefaults())}
	if len(c.GetTenants()) > 0 {
		d.Tenants = make(map[string]runtimecfg.Scope, len(c.Tenants))
		for n, t := range c.Tenants {
			s := scopeFromProto(t)
			if s.MaxSeries == nil && s.MaxSeriesPerPartition == nil && s.IngestionRate == nil && s.IngestionBurst == nil && len(s.SampleRates) == 0 {
				continue // an empty scope means nothing; one encoding per meaning
			}
			d.Tenants[n] = s
		}
	}
	g := c.GetGlobal()
	if len(g.GetSampleRates()) > 0 {
		d.Global.SampleRates = copyRates(g.SampleRates)
	}
	if bc := g.GetBacklogController(); bc != nil {
		d.Global.BacklogController = &runtimecfg.BacklogController{Kind: bc.Kind, Target: bc.Target,
			Period: time.Duration(min(bc.PeriodMs, uint64(runtimecfg.MaxPeriod/time.Millisecond)+1)) * time.Millisecond,
			Kp:     bc.Kp, Ki: bc.Ki, MinPercent: bc.MinPercent}
	}
	for dom, text := range c.GetEnvoy() {
		ec, err := envoyrl.Parse([]byte(text))
		if err != nil {
			return nil, &runtimecfg.FieldError{Field: fmt.Sprintf("envoy[%q]", dom), Msg: err.Error()}
		}
		if ec.Domain != dom {
			return nil, &runtimecfg.FieldError{Field: fmt.Sprintf("envoy[%q].domain", dom), Msg: fmt.Sprintf("%q does not match the domain it is filed under", ec.Domain)}
		}
		if d.Envoy == nil {
			d.Envoy = map[string]*envoyrl.Config{}
		}
		d.Envoy[dom] = ec
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

func scopeFromProto(t *api.TenantLimits) runtimecfg.Scope {
	if t == nil {
		return runtimecfg.Scope{}
	}
	s := runtimecfg.Scope{}
	if t.MaxSeries != nil {
		v := *t.MaxSeries
		s.MaxSeries = &v
	}
	if t.MaxSeriesPerPartition != nil {
		v := *t.MaxSeriesPerPartition
		s.MaxSeriesPerPartition = &v
	}
	if t.IngestionRate != nil {
		v := *t.IngestionRate
		s.IngestionRate = &v
	}
	if t.IngestionBurst != nil {
		v := *t.IngestionBurst
		s.IngestionBurst = &v
	}
	if len(t.SampleRates) > 0 {
		s.SampleRates = copyRates(t.SampleRates)
	}
	return s
}

func copyRates(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
