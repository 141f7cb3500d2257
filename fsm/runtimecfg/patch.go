package runtimecfg

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/limits"
)

// TargetKind selects the scope a patch changes.
type TargetKind byte

// Patch targets.
const (
	TargetDefaults TargetKind = 0
	TargetTenant   TargetKind = 1
	TargetGlobal   TargetKind = 2
)

// Target is the scope a patch changes: the defaults, one tenant, or the global
// settings.
type Target struct {
	Kind   TargetKind
	Tenant string // TargetTenant only
}

// Path is the target's field prefix in error messages and YAML.
func (t Target) Path() string {
	switch t.Kind {
	case TargetTenant:
		return "tenants." + quoteKey(t.Tenant)
	case TargetGlobal:
		return "global"
	}
	return "defaults"
}

// OpKind is what one patch operation does.
type OpKind byte

// Patch operations.
const (
	OpSet   OpKind = 1 // set Key to Value
	OpUnset OpKind = 2 // remove Key (inherit again)
	OpClear OpKind = 3 // remove every key of the target (a tenant's scope disappears)
)

// Op is one operation of a patch. Keys are spelled as in YAML, sample rates
// and controller fields with a dot: "max_series", "sample_rates.locate",
// "backlog_controller.kp". Values are text, parsed by the same rules on every
// replica, so a patch entry applies identically everywhere.
type Op struct {
	Kind  OpKind
	Key   string
	Value string
}

// Patch changes some keys of one scope. With HasExpected, it applies only if
// the document's version is Expected (compare-and-set); without, it applies on
// top of whatever version is current, which is safe for `limits set` because
// it changes only the keys it names.
type Patch struct {
	HasExpected bool
	Expected    uint64
	Target      Target
	Ops         []Op
}

// MaxOps bounds the operations of one patch.
const MaxOps = 1024

// ApplyPatch returns a validated copy of d with p's operations applied (the
// version is not changed; the caller decides it). Errors are *FieldError
// naming the field, and leave d untouched.
func (d *Document) ApplyPatch(p Patch) (*Document, error) {
	if len(p.Ops) > MaxOps {
		return nil, fieldErr(p.Target.Path(), "%d operations in one change, at most %d allowed", len(p.Ops), MaxOps)
	}
	switch p.Target.Kind {
	case TargetDefaults, TargetGlobal:
	case TargetTenant:
		if err := layout.ValidateTenantID(p.Target.Tenant); err != nil {
			return nil, fieldErr("tenants."+quoteKey(p.Target.Tenant), "%v", err)
		}
	default:
		return nil, fieldErr("target", "unknown target kind %d", p.Target.Kind)
	}
	n := d.Clone()
	if n.Tenants == nil {
		n.Tenants = map[string]Scope{}
	}
	for _, op := range p.Ops {
		var err error
		if p.Target.Kind == TargetGlobal {
			err = n.Global.apply(op)
		} else {
			s := n.Defaults
			if p.Target.Kind == TargetTenant {
				s = n.Tenants[p.Target.Tenant]
			}
			err = s.apply(p.Target.Path(), op)
			if p.Target.Kind == TargetTenant {
				if s.empty() {
					delete(n.Tenants, p.Target.Tenant)
				} else {
					n.Tenants[p.Target.Tenant] = s
				}
			} else {
				n.Defaults = s
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if len(n.Tenants) == 0 {
		n.Tenants = nil
	}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	return n, nil
}

func (s *Scope) apply(where string, op Op) error {
	field := where + "." + op.Key
	if op.Kind == OpClear {
		*s = Scope{}
		return nil
	}
	if op.Kind != OpSet && op.Kind != OpUnset {
		return fieldErr(field, "unknown operation %d", op.Kind)
	}
	set := op.Kind == OpSet
	if kind, ok := strings.CutPrefix(op.Key, limits.SampleRateKey("")); ok {
		return applySampleRate(&s.SampleRates, field, kind, op)
	}
	switch op.Key {
	case limits.KeyMaxSeries:
		return setInt(&s.MaxSeries, field, op)
	case limits.KeyMaxSeriesPerPartition:
		return setInt(&s.MaxSeriesPerPartition, field, op)
	case limits.KeyIngestionBurst:
		return setInt(&s.IngestionBurst, field, op)
	case limits.KeyIngestionRate:
		if !set {
			s.IngestionRate = nil
			return nil
		}
		v, err := parseFloat(field, op.Value)
		if err != nil {
			return err
		}
		s.IngestionRate = &v
		return nil
	case limits.KeySampleRates:
		if set {
			return fieldErr(field, "set one kind at a time: %s=<percent>", limits.SampleRateKey("<kind>"))
		}
		s.SampleRates = nil
		return nil
	case limits.KeyUnlimited:
		if !set {
			return fieldErr(field, "unset %s instead", limits.KeyMaxSeries)
		}
		b, err := strconv.ParseBool(op.Value)
		if err != nil {
			return fieldErr(field, "%q is not true or false", op.Value)
		}
		if b {
			s.MaxSeries = ptr[int64](0)
		}
		return nil
	}
	return fieldErr(field, "unknown key (keys: %s, %s)", strings.Join(limits.Keys, ", "), limits.SampleRateKey("<kind>"))
}

func setInt(dst **int64, field string, op Op) error {
	if op.Kind == OpUnset {
		*dst = nil
		return nil
	}
	v, err := strconv.ParseInt(strings.TrimSpace(op.Value), 10, 64)
	if err != nil {
		return fieldErr(field, "%q is not an integer", op.Value)
	}
	*dst = &v
	return nil
}

func parseFloat(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fieldErr(field, "%q is not a number", s)
	}
	return v, nil
}

func (g *Global) apply(op Op) error {
	field := "global." + op.Key
	if op.Kind == OpClear {
		*g = Global{}
		return nil
	}
	if op.Kind != OpSet && op.Kind != OpUnset {
		return fieldErr(field, "unknown operation %d", op.Kind)
	}
	set := op.Kind == OpSet
	if kind, ok := strings.CutPrefix(op.Key, limits.SampleRateKey("")); ok {
		return applySampleRate(&g.SampleRates, field, kind, op)
	}
	if op.Key == "backlog_controller" {
		if set {
			return fieldErr(field, "set one field at a time: backlog_controller.<kind|target|period|kp|ki|min_percent>=<value>")
		}
		g.BacklogController = nil
		return nil
	}
	name, ok := strings.CutPrefix(op.Key, "backlog_controller.")
	if !ok {
		return fieldErr(field, "unknown key (keys: %s, backlog_controller.<field>)", limits.SampleRateKey("<kind>"))
	}
	if !set {
		return fieldErr(field, "a controller field cannot be unset; unset backlog_controller to remove the controller")
	}
	bc := BacklogController{}
	if g.BacklogController != nil {
		bc = *g.BacklogController
	}
	var err error
	switch name {
	case "kind":
		bc.Kind = op.Value
	case "target":
		bc.Target, err = parseFloat(field, op.Value)
	case "kp":
		bc.Kp, err = parseFloat(field, op.Value)
	case "ki":
		bc.Ki, err = parseFloat(field, op.Value)
	case "min_percent":
		bc.MinPercent, err = parseFloat(field, op.Value)
	case "period":
		bc.Period, err = time.ParseDuration(strings.TrimSpace(op.Value))
		if err != nil {
			err = fieldErr(field, "%q is not a duration (e.g. 10s)", op.Value)
		}
	default:
		return fieldErr(field, "unknown key (fields: kind, target, period, kp, ki, min_percent)")
	}
	if err != nil {
		return err
	}
	g.BacklogController = &bc
	return nil
}

// ParseSetArg turns one CLI argument "key=value" into a set operation.
func ParseSetArg(arg string) (Op, error) {
	k, v, ok := strings.Cut(arg, "=")
	if !ok || k == "" {
		return Op{}, fmt.Errorf("%q: want key=value", arg)
	}
	return Op{Kind: OpSet, Key: strings.TrimSpace(k), Value: v}, nil
}

// applySampleRate sets or unsets one kind's percentage in a sample_rates map
// (tenant, defaults and global scopes share the rule).
func applySampleRate(rates *map[string]float64, field, kind string, op Op) error {
	if err := ValidateKind(kind); err != nil {
		return fieldErr(field, "%v", err)
	}
	if op.Kind != OpSet {
		delete(*rates, kind)
		return nil
	}
	v, err := parseFloat(field, op.Value)
	if err != nil {
		return err
	}
	if *rates == nil {
		*rates = map[string]float64{}
	}
	(*rates)[kind] = v
	return nil
}
