package runtimecfg

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-io/tollgate/envoyrl"
	"github.com/tollgate-io/tollgate/limits"
)

// The YAML form, shared by --limits-file, `tollgate limits apply/diff -f` and
// `tollgate limits get`:
//
//	version: 7            # optional: apply only if the cluster is at version 7
//	defaults:
//	  max_series: 150000  # 0 = unlimited; keys left out inherit the server's flags
//	  sample_rates:
//	    locate: 100
//	tenants:
//	  acme:
//	    max_series: 1000000
//	    ingestion_rate: 5000   # per second, 0 = off
//	    ingestion_burst: 10000
//	    max_series_per_partition: 20000
//	    sample_rates:
//	      submit: 25
//	  tenant-b:
//	    unlimited: true        # same as max_series: 0
//	global:
//	  sample_rates:
//	    locate: 50
//	  backlog_controller: {kind: locate, target: 10000, period: 10s, kp: 0.002, ki: 0, min_percent: 1}
//	envoy:                     # Envoy rate limit service, envoyproxy/ratelimit format, one item per domain
//	  - domain: edge
//	    descriptors:
//	      - key: remote_address
//	        rate_limit: {unit: second, requests_per_unit: 10}
//
// Every value goes through the same parser as `tollgate limits set key=value`,
// so both report a bad value alike, naming the field (and here the line).

// ParseYAML parses and validates a YAML document. expected is the file's
// `version:` key (nil when absent). Unknown keys are errors: a typo must not
// silently leave a tenant on its default.
func ParseYAML(data []byte) (d *Document, expected *uint64, err error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, fmt.Errorf("limits: %w", err)
	}
	d = &Document{}
	if root.Kind == 0 || len(root.Content) == 0 {
		return d, nil, nil // empty file
	}
	top := root.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return d, nil, nil
	}
	err = eachKey(top, "", func(key string, v *yaml.Node) error {
		switch key {
		case "version":
			n, err := strconv.ParseUint(v.Value, 10, 64)
			if v.Kind != yaml.ScalarNode || err != nil {
				return lineErr(fieldErr("version", "%q is not a version number", v.Value), v)
			}
			expected = &n
			return nil
		case "defaults":
			return parseScope(v, "defaults", &d.Defaults)
		case "tenants":
			d.Tenants = map[string]Scope{}
			return eachKey(v, "tenants", func(name string, tv *yaml.Node) error {
				var s Scope
				if err := parseScope(tv, "tenants."+quoteKey(name), &s); err != nil {
					return err
				}
				d.Tenants[name] = s
				return nil
			})
		case "global":
			return parseGlobal(v, &d.Global)
		case "envoy":
			return parseEnvoy(v, d)
		}
		return lineErr(fieldErr(key, "unknown key (top-level keys: version, defaults, tenants, global, envoy)"), v)
	})
	if err != nil {
		return nil, nil, err
	}
	// A tenant listed with no keys ("tenant-b: {}") holds nothing: dropping it
	// keeps one encoding per meaning.
	for n, s := range d.Tenants {
		if s.empty() {
			delete(d.Tenants, n)
		}
	}
	if len(d.Tenants) == 0 {
		d.Tenants = nil
	}
	if err := d.Validate(); err != nil {
		return nil, nil, err
	}
	return d, expected, nil
}

// parseEnvoy reads the envoy list: one envoyproxy/ratelimit configuration per
// item, domains unique.
func parseEnvoy(n *yaml.Node, d *Document) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return lineErr(fieldErr("envoy", "want a list of rate limit configurations (domain, descriptors)"), n)
	}
	for i, item := range n.Content {
		c, err := envoyrl.ParseNode(item, fmt.Sprintf("envoy[%d].", i))
		if err != nil {
			return err
		}
		if _, dup := d.Envoy[c.Domain]; dup {
			return lineErr(fieldErr(fmt.Sprintf("envoy[%d].domain", i), "%q is configured twice", c.Domain), item)
		}
		if d.Envoy == nil {
			d.Envoy = map[string]*envoyrl.Config{}
		}
		d.Envoy[c.Domain] = c
	}
	return nil
}

// RenderEnvoy renders one domain's configuration as a list item of the
// envoy key.
func renderEnvoy(b *bytes.Buffer, c *envoyrl.Config) {
	text := envoyrl.Render(c, "    ")
	b.WriteString("  - ")
	b.Write(text[4:])
}

// eachKey calls fn for every key of a mapping node, refusing duplicates and
// non-mapping nodes (an empty value counts as an empty mapping).
func eachKey(n *yaml.Node, where string, fn func(string, *yaml.Node) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return lineErr(fieldErr(orRoot(where), "want a mapping of keys"), n)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if seen[k.Value] {
			return lineErr(fieldErr(join(where, k.Value), "key given twice"), k)
		}
		seen[k.Value] = true
		if err := fn(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

func orRoot(where string) string {
	if where == "" {
		return "(document)"
	}
	return where
}

func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}

// lineErr adds the YAML line to a field error.
func lineErr(err error, n *yaml.Node) error {
	if fe, ok := err.(*FieldError); ok && n != nil && n.Line > 0 {
		return &FieldError{Field: fe.Field, Msg: fmt.Sprintf("%s (line %d)", fe.Msg, n.Line)}
	}
	return err
}

func scalar(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return "", lineErr(fieldErr(field, "want a single value"), v)
	}
	return v.Value, nil
}

// plainScalar is scalar for keys whose value is a number or a boolean: a
// quoted value ("10") is a string in YAML and JSON, and a file that quotes
// a limit most likely means something else than the number (a templating
// slip, a unit left out); it is refused naming the field.
func plainScalar(v *yaml.Node, field string) (string, error) {
	val, err := scalar(v, field)
	if err == nil && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
		return "", lineErr(fieldErr(field, "%q is a quoted string; write the value without quotes", val), v)
	}
	return val, err
}

func parseScope(n *yaml.Node, where string, s *Scope) error {
	unlimited := false
	err := eachKey(n, where, func(key string, v *yaml.Node) error {
		if key == limits.KeySampleRates {
			return eachKey(v, where+"."+limits.KeySampleRates, func(kind string, pv *yaml.Node) error {
				val, err := plainScalar(pv, where+"."+limits.SampleRateKey(kind))
				if err != nil {
					return err
				}
				return lineErr(applyChecked(s, where, Op{Kind: OpSet, Key: limits.SampleRateKey(kind), Value: val}), pv)
			})
		}
		val, err := plainScalar(v, join(where, key))
		if err != nil {
			return err
		}
		if key == limits.KeyUnlimited {
			b, err := strconv.ParseBool(val)
			if err != nil {
				return lineErr(fieldErr(where+"."+limits.KeyUnlimited, "%q is not true or false", val), v)
			}
			unlimited = b
			return nil
		}
		return lineErr(applyChecked(s, where, Op{Kind: OpSet, Key: key, Value: val}), v)
	})
	if err != nil {
		return err
	}
	if unlimited {
		if s.MaxSeries != nil && *s.MaxSeries != 0 {
			return lineErr(fieldErr(where+"."+limits.KeyUnlimited, "true contradicts %s = %d; keep one", limits.KeyMaxSeries, *s.MaxSeries), n)
		}
		s.MaxSeries = ptr[int64](0)
	}
	return nil
}

// applyChecked applies one key and validates the scope at once, so a range
// error carries the line of the key that caused it.
func applyChecked(s *Scope, where string, op Op) error {
	if err := s.apply(where, op); err != nil {
		return err
	}
	return s.validate(where)
}

func parseGlobal(n *yaml.Node, g *Global) error {
	return eachKey(n, "global", func(key string, v *yaml.Node) error {
		switch key {
		case limits.KeySampleRates:
			return eachKey(v, "global."+limits.KeySampleRates, func(kind string, pv *yaml.Node) error {
				val, err := plainScalar(pv, "global."+limits.SampleRateKey(kind))
				if err != nil {
					return err
				}
				if err := g.apply(Op{Kind: OpSet, Key: limits.SampleRateKey(kind), Value: val}); err != nil {
					return lineErr(err, pv)
				}
				return lineErr(validateRates("global."+limits.KeySampleRates, g.SampleRates), pv)
			})
		case "backlog_controller":
			return eachKey(v, "global.backlog_controller", func(f string, fv *yaml.Node) error {
				get := plainScalar
				if f == "kind" || f == "period" {
					get = scalar // a name and a duration ("1s")
				}
				val, err := get(fv, "global.backlog_controller."+f)
				if err != nil {
					return err
				}
				return lineErr(g.apply(Op{Kind: OpSet, Key: "backlog_controller." + f, Value: val}), fv)
			})
		}
		return lineErr(fieldErr("global."+key, "unknown key (keys: %s, backlog_controller)", limits.KeySampleRates), v)
	})
}

// KV is one setting of a document as a flat key and its value text.
type KV struct{ Key, Value string }

// Flatten lists every setting of d as "path: value" pairs in a fixed order
// (the YAML nesting joined with dots; tenant ids quoted when they hold a
// dot). The version is not a setting and is left out. Diffs compare these.
func Flatten(d *Document) []KV {
	var out []KV
	out = flattenScope(out, "defaults", &d.Defaults)
	for _, n := range d.TenantNames() {
		s := d.Tenants[n]
		out = flattenScope(out, "tenants."+quoteKey(n), &s)
	}
	out = flattenRates(out, "global."+limits.KeySampleRates, d.Global.SampleRates)
	if bc := d.Global.BacklogController; bc != nil {
		p := "global.backlog_controller."
		out = append(out, KV{p + "kind", bc.Kind}, KV{p + "target", fmtFloat(bc.Target)}, KV{p + "period", bc.Period.String()},
			KV{p + "kp", fmtFloat(bc.Kp)}, KV{p + "ki", fmtFloat(bc.Ki)}, KV{p + "min_percent", fmtFloat(bc.MinPercent)})
	}
	for _, dom := range d.EnvoyDomains() {
		out = flattenEnvoy(out, "envoy."+quoteKey(dom), d.Envoy[dom].Descriptors)
	}
	return out
}

// flattenEnvoy lists every descriptor of an Envoy configuration as
// "envoy.<domain>.<key>_<value>…: <what it does>".
func flattenEnvoy(out []KV, where string, ds []envoyrl.Descriptor) []KV {
	for i := range ds {
		d := &ds[i]
		p := d.Key
		if d.Value != "" {
			p += "_" + d.Value
		}
		p = where + "." + quoteKey(p)
		var v []string
		if rl := d.RateLimit; rl != nil {
			if rl.Unlimited {
				v = append(v, "unlimited")
			} else {
				v = append(v, fmt.Sprintf("%d/%s", rl.RequestsPerUnit, rl.Unit))
			}
			if rl.Name != "" {
				v = append(v, "name="+rl.Name)
			}
			if len(rl.Replaces) > 0 {
				v = append(v, "replaces="+strings.Join(rl.Replaces, ","))
			}
		} else if len(d.Descriptors) == 0 {
			v = append(v, "no limit")
		}
		if d.ShadowMode {
			v = append(v, "shadow_mode")
		}
		if d.DetailedMetric {
			v = append(v, "detailed_metric")
		}
		if len(v) > 0 {
			out = append(out, KV{p, strings.Join(v, " ")})
		}
		out = flattenEnvoy(out, p, d.Descriptors)
	}
	return out
}

func flattenScope(out []KV, where string, s *Scope) []KV {
	renderLimits(&s.Overrides, func(key, value string) { out = append(out, KV{where + "." + key, value}) })
	return flattenRates(out, where+"."+limits.KeySampleRates, s.SampleRates)
}

// renderLimits calls put for each limit key the scope sets, in the
// document's order, with its value as YAML and `limits set` write it.
func renderLimits(o *limits.Overrides, put func(key, value string)) {
	if o.MaxSeries != nil {
		put(limits.KeyMaxSeries, strconv.FormatInt(*o.MaxSeries, 10))
	}
	if o.MaxSeriesPerPartition != nil {
		put(limits.KeyMaxSeriesPerPartition, strconv.FormatInt(*o.MaxSeriesPerPartition, 10))
	}
	if o.IngestionRate != nil {
		put(limits.KeyIngestionRate, fmtFloat(*o.IngestionRate))
	}
	if o.IngestionBurst != nil {
		put(limits.KeyIngestionBurst, strconv.FormatInt(*o.IngestionBurst, 10))
	}
}

func flattenRates(out []KV, where string, m map[string]float64) []KV {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, KV{where + "." + k, fmtFloat(m[k])})
	}
	return out
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// RenderYAML writes d in the YAML form ParseYAML reads, keys in a fixed order,
// with the version as the `version:` key (so get → edit → apply is a
// compare-and-set). The bytes are a function of the document alone.
func RenderYAML(d *Document) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "version: %d\n", d.Version)
	if !d.Defaults.empty() {
		b.WriteString("defaults:\n")
		renderScope(&b, "  ", &d.Defaults)
	}
	if len(d.Tenants) > 0 {
		b.WriteString("tenants:\n")
		for _, n := range d.TenantNames() {
			s := d.Tenants[n]
			fmt.Fprintf(&b, "  %s:\n", yamlKey(n))
			renderScope(&b, "    ", &s)
		}
	}
	if len(d.Global.SampleRates) > 0 || d.Global.BacklogController != nil {
		b.WriteString("global:\n")
		renderRates(&b, "  ", d.Global.SampleRates)
		if bc := d.Global.BacklogController; bc != nil {
			b.WriteString("  backlog_controller:\n")
			fmt.Fprintf(&b, "    kind: %s\n    target: %s\n    period: %s\n    kp: %s\n    ki: %s\n    min_percent: %s\n",
				bc.Kind, fmtFloat(bc.Target), bc.Period, fmtFloat(bc.Kp), fmtFloat(bc.Ki), fmtFloat(bc.MinPercent))
		}
	}
	if len(d.Envoy) > 0 {
		b.WriteString("envoy:\n")
		for _, dom := range d.EnvoyDomains() {
			renderEnvoy(&b, d.Envoy[dom])
		}
	}
	return b.Bytes()
}

func renderScope(b *bytes.Buffer, ind string, s *Scope) {
	renderLimits(&s.Overrides, func(key, value string) { fmt.Fprintf(b, "%s%s: %s\n", ind, key, value) })
	renderRates(b, ind, s.SampleRates)
}

func renderRates(b *bytes.Buffer, ind string, m map[string]float64) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintf(b, "%s%s:\n", ind, limits.KeySampleRates)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(b, "%s  %s: %s\n", ind, k, fmtFloat(m[k]))
	}
}

// yamlKey quotes a tenant id unless it is a plain YAML scalar that reads back
// as the same string.
func yamlKey(n string) string {
	plain := n != "" && !strings.ContainsAny(n[:1], "!*'-.(") && !strings.ContainsAny(n, "'") &&
		strings.ToLower(n) != "true" && strings.ToLower(n) != "false" && strings.ToLower(n) != "null" && strings.ToLower(n) != "yes" && strings.ToLower(n) != "no" && strings.ToLower(n) != "on" && strings.ToLower(n) != "off" && n != "~"
	if _, err := strconv.ParseFloat(n, 64); err == nil {
		plain = false
	}
	if plain {
		return n
	}
	return strconv.Quote(n)
}
