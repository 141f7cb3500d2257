package runtimecfg

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/limits"
	"github.com/tollgate-io/tollgate/sampleconf"
)

// Bounds that keep a document (and so a log entry and a snapshot section)
// reasonably small, and make a corrupt one fail fast on decode.
const (
	MaxTenants     = 100_000
	MaxKinds       = 64   // sample-rate kinds per scope
	MaxKindLength  = 32   // bytes of a kind name
	MaxRate        = 1e15 // tokens per second
	MinPeriod      = time.Millisecond
	MaxPeriod      = time.Hour
	DefaultPercent = 100.0
	// MaxEnvoyDomains bounds the Envoy rate limit configurations (one per
	// domain) a document carries.
	MaxEnvoyDomains = 1000
	// MaxEnvoyBytes bounds one domain's canonical configuration text.
	MaxEnvoyBytes = 4 << 20
)

// Scope is one section of limits: the defaults, or one tenant's overrides. A
// nil pointer (or an absent sample-rate kind) means "not set here: inherit";
// 0 means "no limit" (max_series 0 = unlimited, ingestion_rate 0 = off,
// max_series_per_partition 0 = off).
//
// The limit keys are limits.Overrides, embedded: the fields and the
// inheritance rule are the limits package's, and the byte, YAML and JSON
// forms are unchanged by the embedding (the codec names each field; JSON
// flattens an embedded struct without a tag).
type Scope struct {
	limits.Overrides
	// SampleRates: traffic kind → percent in [0, 100]; a kind left out is 100%.
	SampleRates map[string]float64
}

// Global holds the settings that are not per tenant.
type Global struct {
	// SampleRates: traffic kind → global percent in [0, 100], multiplied with
	// the key's percent; a kind left out is 100%.
	SampleRates map[string]float64
	// BacklogController, when set, adjusts SampleRates[Kind] from the backlog
	// clients report (the controller lives beside the config owner; this is
	// only its configuration).
	BacklogController *BacklogController
}

// BacklogController configures the proportional (optionally PI) controller
// that sets the global sample percentage of one kind from a reported backlog.
// The document checks each value's range; whether the gains make a stable
// loop is the controller's business (it disables itself and says why).
type BacklogController struct {
	Kind       string        // traffic kind whose global percentage it sets
	Target     float64       // backlog (items) it steers towards; > 0
	Period     time.Duration // control period; whole milliseconds in [1ms, 1h]
	Kp, Ki     float64       // gains, ≥ 0, Kp > 0
	MinPercent float64       // floor of the percentage it sets, [0, 100]
}

// Document is one version of the runtime configuration. A published Document
// is immutable: changes make a new one (Clone).
type Document struct {
	// Version increases by at least one with every change; 0 means no
	// replicated configuration exists yet.
	Version  uint64
	Defaults Scope
	Tenants  map[string]Scope
	Global   Global
	// Envoy holds the Envoy rate limit service's configurations in the
	// envoyproxy/ratelimit format, by domain. Configurations are immutable:
	// a change replaces a domain's value.
	Envoy map[string]*envoyrl.Config
}

// EnvoyDomains lists the configured Envoy rate limit domains, sorted.
func (d *Document) EnvoyDomains() []string { return slices.Sorted(maps.Keys(d.Envoy)) }

// Effective is a tenant's limits after inheritance (package limits).
type Effective = limits.Effective

// For returns a tenant's effective limits over base: the server's base (its
// flags), overlaid by the document's defaults, overlaid by the tenant's
// scope (limits.Resolve, the one inheritance rule).
func (d *Document) For(tenant string, base Effective) Effective {
	scopes := []limits.Overrides{d.Defaults.Limits()}
	if s, ok := d.Tenants[tenant]; ok {
		scopes = append(scopes, s.Limits())
	}
	return limits.Resolve(base, scopes...)
}

// Limits are the limit keys the scope sets.
func (s *Scope) Limits() limits.Overrides { return s.Overrides }

// SampleRate is the tenant's (or API key's) percent for a kind: its own
// setting, else the defaults', else 100. The global percent is separate
// (GlobalSampleRate); a sampler multiplies the two.
func (d *Document) SampleRate(tenant, kind string) float64 {
	if s, ok := d.Tenants[tenant]; ok {
		if p, ok := s.SampleRates[kind]; ok {
			return p
		}
	}
	if p, ok := d.Defaults.SampleRates[kind]; ok {
		return p
	}
	return DefaultPercent
}

// GlobalSampleRate is the global percent for a kind (100 when unset).
func (d *Document) GlobalSampleRate(kind string) float64 {
	if p, ok := d.Global.SampleRates[kind]; ok {
		return p
	}
	return DefaultPercent
}

// TenantNames lists the tenants with a scope of their own, sorted.
func (d *Document) TenantNames() []string { return slices.Sorted(maps.Keys(d.Tenants)) }

// Clone returns a deep copy (the caller may change it).
func (d *Document) Clone() *Document {
	c := &Document{Version: d.Version, Defaults: d.Defaults.clone(), Global: d.Global.clone()}
	if d.Tenants != nil {
		c.Tenants = make(map[string]Scope, len(d.Tenants))
		for n, s := range d.Tenants {
			c.Tenants[n] = s.clone()
		}
	}
	c.Envoy = maps.Clone(d.Envoy)
	return c
}

func (s Scope) clone() Scope {
	c := Scope{SampleRates: maps.Clone(s.SampleRates)}
	if s.MaxSeries != nil {
		c.MaxSeries = ptr(*s.MaxSeries)
	}
	if s.MaxSeriesPerPartition != nil {
		c.MaxSeriesPerPartition = ptr(*s.MaxSeriesPerPartition)
	}
	if s.IngestionRate != nil {
		c.IngestionRate = ptr(*s.IngestionRate)
	}
	if s.IngestionBurst != nil {
		c.IngestionBurst = ptr(*s.IngestionBurst)
	}
	return c
}

func (g Global) clone() Global {
	c := Global{SampleRates: maps.Clone(g.SampleRates)}
	if g.BacklogController != nil {
		bc := *g.BacklogController
		c.BacklogController = &bc
	}
	return c
}

func (s *Scope) empty() bool {
	return s.MaxSeries == nil && s.MaxSeriesPerPartition == nil && s.IngestionRate == nil && s.IngestionBurst == nil && len(s.SampleRates) == 0
}

func ptr[T any](v T) *T { return &v }

// SameContent reports whether two documents hold the same settings, whatever
// their versions.
func SameContent(a, b *Document) bool {
	return string(AppendBody(nil, a)) == string(AppendBody(nil, b))
}

// FieldError is a validation failure naming the field in the YAML / set-key
// spelling ("tenants.acme.ingestion_rate", "global.backlog_controller.kp").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every value of the document, returning the first problem
// (fields in a fixed order, tenants sorted, so the same document always
// reports the same error). It also normalises -0 to 0, so the canonical byte
// form has a single spelling of zero.
func (d *Document) Validate() error {
	if err := d.Defaults.validate("defaults"); err != nil {
		return err
	}
	if len(d.Tenants) > MaxTenants {
		return fieldErr("tenants", "%d tenants, at most %d allowed", len(d.Tenants), MaxTenants)
	}
	for _, name := range d.TenantNames() {
		if err := layout.ValidateTenantID(name); err != nil {
			return fieldErr("tenants."+quoteKey(name), "%v", err)
		}
		s := d.Tenants[name]
		if err := s.validate("tenants." + quoteKey(name)); err != nil {
			return err
		}
	}
	if err := validateRates("global."+limits.KeySampleRates, d.Global.SampleRates); err != nil {
		return err
	}
	if bc := d.Global.BacklogController; bc != nil {
		if err := bc.validate("global.backlog_controller"); err != nil {
			return err
		}
	}
	if len(d.Envoy) > MaxEnvoyDomains {
		return fieldErr("envoy", "%d domains, at most %d allowed", len(d.Envoy), MaxEnvoyDomains)
	}
	for i, dom := range d.EnvoyDomains() {
		c := d.Envoy[dom]
		switch {
		case c == nil:
			return fieldErr(fmt.Sprintf("envoy[%d]", i), "domain %q has no configuration", dom)
		case c.Domain != dom:
			return fieldErr(fmt.Sprintf("envoy[%d].domain", i), "%q filed under domain %q", c.Domain, dom)
		case len(envoyrl.Render(c, "")) > MaxEnvoyBytes:
			return fieldErr(fmt.Sprintf("envoy[%d]", i), "domain %q: configuration above %d bytes", dom, MaxEnvoyBytes)
		}
	}
	return nil
}

// quoteKey keeps a field path readable: tenant ids may contain '.', which
// would make "tenants.a.b.max_series" ambiguous.
func quoteKey(name string) string {
	if strings.ContainsAny(name, ".'") {
		return strconv.Quote(name)
	}
	return name
}

func (s *Scope) validate(where string) error {
	if s.MaxSeries != nil && *s.MaxSeries < 0 {
		return fieldErr(where+"."+limits.KeyMaxSeries, "%d must be ≥ 0 (0 = unlimited)", *s.MaxSeries)
	}
	if s.MaxSeriesPerPartition != nil && *s.MaxSeriesPerPartition < 0 {
		return fieldErr(where+"."+limits.KeyMaxSeriesPerPartition, "%d must be ≥ 0 (0 = off)", *s.MaxSeriesPerPartition)
	}
	if s.IngestionRate != nil {
		v := *s.IngestionRate
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxRate {
			return fieldErr(where+"."+limits.KeyIngestionRate, "%v must be a finite number in [0, %g] (per second; 0 = off)", v, MaxRate)
		}
		*s.IngestionRate = v + 0 // -0 → 0
	}
	if s.IngestionBurst != nil && *s.IngestionBurst < 0 {
		return fieldErr(where+"."+limits.KeyIngestionBurst, "%d must be ≥ 0", *s.IngestionBurst)
	}
	return validateRates(where+"."+limits.KeySampleRates, s.SampleRates)
}

func validateRates(where string, rates map[string]float64) error {
	if len(rates) > MaxKinds {
		return fieldErr(where, "%d kinds, at most %d allowed", len(rates), MaxKinds)
	}
	for _, k := range slices.Sorted(maps.Keys(rates)) {
		if err := ValidateKind(k); err != nil {
			return fieldErr(where+"."+quoteKey(k), "%v", err)
		}
		p := rates[k]
		if math.IsNaN(p) || p < 0 || p > 100 {
			return fieldErr(where+"."+k, "%v must be a percentage in [0, 100]", p)
		}
		rates[k] = p + 0
	}
	return nil
}

// ValidateKind checks a traffic kind name in the replicated config: the
// samplers' rule (sampleconf.ValidateKind) narrowed to 1..32 bytes of
// [a-z0-9_-], so every kind a config names is one every sampler takes. The
// narrowing is what replicas have always applied: entries validate the same
// on every version.
func ValidateKind(k string) error {
	if len(k) < 1 || len(k) > MaxKindLength {
		return fmt.Errorf("kind %q must be 1..%d bytes", k, MaxKindLength)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c >= 'A' && c <= 'Z' {
			return fmt.Errorf("kind %q: byte %d is not one of [a-z0-9_-]", k, i)
		}
	}
	if err := sampleconf.ValidateKind(k); err != nil {
		return fmt.Errorf("kind %q: not one of [a-z0-9_-]: %w", k, err)
	}
	return nil
}

func (b *BacklogController) validate(where string) error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case ValidateKind(b.Kind) != nil:
		return fieldErr(where+".kind", "%v (the kind whose global sample rate it sets)", ValidateKind(b.Kind))
	case !finite(b.Target) || b.Target <= 0:
		return fieldErr(where+".target", "%v must be a finite backlog > 0", b.Target)
	case b.Period < MinPeriod || b.Period > MaxPeriod || b.Period%time.Millisecond != 0:
		return fieldErr(where+".period", "%v must be whole milliseconds in [%v, %v]", b.Period, MinPeriod, MaxPeriod)
	case !finite(b.Kp) || b.Kp <= 0:
		return fieldErr(where+".kp", "%v must be a finite gain > 0", b.Kp)
	case !finite(b.Ki) || b.Ki < 0:
		return fieldErr(where+".ki", "%v must be a finite gain ≥ 0 (0 = proportional only)", b.Ki)
	case math.IsNaN(b.MinPercent) || b.MinPercent < 0 || b.MinPercent > 100:
		return fieldErr(where+".min_percent", "%v must be a percentage in [0, 100]", b.MinPercent)
	}
	b.Target += 0
	b.Kp += 0
	b.Ki += 0
	b.MinPercent += 0
	return nil
}
