package envoyrl

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Unit is a rate limit's time unit.
type Unit int

// Units of the format (the numbers are envoy.service.ratelimit.v3's: week
// came after month and year).
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

var unitNames = map[Unit]string{Second: "second", Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month", Year: "year"}

// unitList names the units in errors.
const unitList = "second, minute, hour, day, week, month or year"

func (u Unit) String() string {
	if n, ok := unitNames[u]; ok {
		return n
	}
	return fmt.Sprintf("unit(%d)", int(u))
}

// Seconds is the unit's length in seconds.
func (u Unit) Seconds() int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86400
	case Week:
		return 7 * 86400
	case Month:
		return 30 * 86400 // as the reference counts a month
	case Year:
		return 365 * 86400
	}
	return 0
}

// ParseUnit reads a unit name, case-insensitively as the reference service does.
func ParseUnit(s string) (Unit, error) {
	for u, n := range unitNames {
		if strings.EqualFold(s, n) {
			return u, nil
		}
	}
	return 0, fmt.Errorf("unit %q: want %s", s, unitList)
}

// Bounds that keep a configuration (carried in raft entries and snapshots)
// small, and make nonsense fail fast.
const (
	MaxDepth       = 16     // nesting levels of descriptors
	MaxDescriptors = 10_000 // descriptors in one domain, all levels
	MaxString      = 256    // bytes of a domain, key, value or name
)

// RateLimit is a descriptor's rule.
type RateLimit struct {
	Name            string   // optional; what other rules' replaces name
	Replaces        []string // names of rules this one replaces when both match a request
	Unit            Unit     // not set when Unlimited
	RequestsPerUnit uint32   // 0 rejects every request
	Unlimited       bool
}

// Descriptor is one node of the descriptor tree.
type Descriptor struct {
	Key   string
	Value string // "" matches any value (one counter per distinct value); a trailing '*' matches a prefix
	// RateLimit is nil for a placeholder (a level that only nests others)
	// and for an allow-listed descriptor.
	RateLimit      *RateLimit
	ShadowMode     bool
	DetailedMetric bool
	// ShareThreshold (a prefix value only): every value the prefix matches
	// counts in one counter, instead of one per value.
	ShareThreshold bool
	Descriptors    []Descriptor
}

// Config is one domain's configuration.
type Config struct {
	Domain      string
	Descriptors []Descriptor
}

// FieldError names the field that is wrong ("descriptors[0].rate_limit.unit")
// and, when parsed from YAML, its line.
type FieldError struct {
	Field string
	Line  int
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: %s (line %d)", e.Field, e.Msg, e.Line)
	}
	return e.Field + ": " + e.Msg
}

func fieldErr(n *yaml.Node, field, format string, args ...any) *FieldError {
	e := &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
	}
	return e
}

// Parse reads one domain's configuration in the envoyproxy/ratelimit YAML
// format and validates it. Unknown keys are errors (a typo must not silently
// drop a limit).
func Parse(data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("envoy rate limit config: %w", err)
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, &FieldError{Field: "domain", Msg: "empty file: want a mapping with domain and descriptors"}
	}
	return ParseNode(root.Content[0], "")
}

// ParseNode reads a configuration from a YAML mapping; prefix is prepended to
// field names in errors ("envoy[2]." when the mapping sits inside another
// document).
func ParseNode(n *yaml.Node, prefix string) (*Config, error) {
	c := &Config{}
	if err := eachKey(n, strings.TrimSuffix(prefix, "."), func(k string, v *yaml.Node) error {
		switch k {
		case "domain":
			s, err := str(v, prefix+"domain")
			c.Domain = s
			return err
		case "descriptors":
			ds, err := parseList(v, prefix+"descriptors", 1)
			c.Descriptors = ds
			return err
		}
		return fieldErr(v, prefix+k, "unknown key (want domain, descriptors)")
	}); err != nil {
		return nil, err
	}
	if err := c.validate(prefix, n); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) validate(prefix string, n *yaml.Node) error {
	if c.Domain == "" {
		return fieldErr(n, prefix+"domain", "required and not empty")
	}
	if len(c.Domain) > MaxString {
		return fieldErr(n, prefix+"domain", "%d bytes, at most %d", len(c.Domain), MaxString)
	}
	if cnt := count(c.Descriptors); cnt > MaxDescriptors {
		return fieldErr(n, prefix+"descriptors", "%d descriptors, at most %d in one domain", cnt, MaxDescriptors)
	}
	return nil
}

func count(ds []Descriptor) int {
	n := len(ds)
	for i := range ds {
		n += count(ds[i].Descriptors)
	}
	return n
}

func parseList(n *yaml.Node, where string, depth int) ([]Descriptor, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fieldErr(n, where, "want a list of descriptors")
	}
	if depth > MaxDepth {
		return nil, fieldErr(n, where, "descriptors nested more than %d levels", MaxDepth)
	}
	out := make([]Descriptor, 0, len(n.Content))
	seen := map[[2]string]int{}
	for i, item := range n.Content {
		at := fmt.Sprintf("%s[%d]", where, i)
		d, err := parseDescriptor(item, at, depth)
		if err != nil {
			return nil, err
		}
		kv := [2]string{d.Key, d.Value}
		if j, dup := seen[kv]; dup {
			return nil, fieldErr(item, at, "duplicate of %s[%d] (same key %q and value %q at one level)", where, j, d.Key, d.Value)
		}
		seen[kv] = i
		out = append(out, d)
	}
	return out, nil
}

func parseDescriptor(n *yaml.Node, at string, depth int) (Descriptor, error) {
	var d Descriptor
	hasKey := false
	var shareNode *yaml.Node
	err := eachKey(n, at, func(k string, v *yaml.Node) error {
		var err error
		switch k {
		case "key":
			d.Key, err = str(v, at+".key")
			hasKey = true
		case "value":
			d.Value, err = str(v, at+".value")
			if err == nil && strings.Contains(strings.TrimSuffix(d.Value, "*"), "*") {
				err = fieldErr(v, at+".value", "%q: '*' is only allowed as the last byte (prefix match)", d.Value)
			}
		case "rate_limit":
			d.RateLimit, err = parseRateLimit(v, at+".rate_limit")
		case "shadow_mode":
			d.ShadowMode, err = boolean(v, at+".shadow_mode")
		case "detailed_metric":
			d.DetailedMetric, err = boolean(v, at+".detailed_metric")
		case "share_threshold":
			shareNode = v
			d.ShareThreshold, err = boolean(v, at+".share_threshold")
		case "descriptors":
			d.Descriptors, err = parseList(v, at+".descriptors", depth+1)
		case "value_to_metric":
			err = fieldErr(v, at+"."+k, "not supported: it puts every request value into the metric names (unbounded cardinality); detailed_metric gives the values of wildcard levels")
		case "quota_mode":
			err = fieldErr(v, at+"."+k, "not supported: quota mode is not implemented; leave it out (descriptors are always enforced, or counted only with shadow_mode)")
		default:
			err = fieldErr(v, at+"."+k, "unknown key (want key, value, rate_limit, shadow_mode, detailed_metric, share_threshold, descriptors)")
		}
		return err
	})
	if err != nil {
		return d, err
	}
	if !hasKey || d.Key == "" {
		return d, fieldErr(n, at+".key", "required and not empty")
	}
	if d.ShareThreshold && !strings.HasSuffix(d.Value, "*") {
		return d, fieldErr(shareNode, at+".share_threshold", "only for a prefix value (value: \"abc*\"): it makes every value the prefix matches share one counter")
	}
	return d, nil
}

func parseRateLimit(n *yaml.Node, at string) (*RateLimit, error) {
	rl := &RateLimit{}
	var unitNode, rpuNode *yaml.Node
	err := eachKey(n, at, func(k string, v *yaml.Node) error {
		var err error
		switch k {
		case "name":
			rl.Name, err = str(v, at+".name")
		case "unit":
			unitNode = v
			var s string
			if s, err = str(v, at+".unit"); err == nil {
				if rl.Unit, err = ParseUnit(s); err != nil {
					err = fieldErr(v, at+".unit", "%v", err)
				}
			}
		case "requests_per_unit":
			rpuNode = v
			var x uint64
			x, err = strconv.ParseUint(v.Value, 10, 32)
			if v.Kind != yaml.ScalarNode || err != nil {
				return fieldErr(v, at+".requests_per_unit", "%q: want a whole number in [0, %d]", v.Value, uint32(1<<32-1))
			}
			rl.RequestsPerUnit = uint32(x)
		case "unlimited":
			rl.Unlimited, err = boolean(v, at+".unlimited")
		case "replaces":
			if v.Kind != yaml.SequenceNode {
				return fieldErr(v, at+".replaces", "want a list of {name: ...}")
			}
			for i, item := range v.Content {
				w := fmt.Sprintf("%s.replaces[%d]", at, i)
				name := ""
				if err := eachKey(item, w, func(k string, v *yaml.Node) error {
					if k != "name" {
						return fieldErr(v, w+"."+k, "unknown key (want name)")
					}
					var err error
					name, err = str(v, w+".name")
					return err
				}); err != nil {
					return err
				}
				if name == "" {
					return fieldErr(item, w+".name", "required and not empty")
				}
				rl.Replaces = append(rl.Replaces, name)
			}
		default:
			err = fieldErr(v, at+"."+k, "unknown key (want name, replaces, unit, requests_per_unit, unlimited)")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, r := range rl.Replaces {
		if rl.Name != "" && r == rl.Name {
			return nil, fieldErr(n, fmt.Sprintf("%s.replaces[%d].name", at, i), "%q is this rule's own name: a rule cannot replace itself", r)
		}
	}
	switch {
	case rl.Unlimited && unitNode != nil:
		return nil, fieldErr(unitNode, at+".unit", "must not be set with unlimited: true")
	case rl.Unlimited && rpuNode != nil:
		return nil, fieldErr(rpuNode, at+".requests_per_unit", "must not be set with unlimited: true")
	case !rl.Unlimited && unitNode == nil:
		return nil, fieldErr(n, at+".unit", "required (%s) unless unlimited: true", unitList)
	case !rl.Unlimited && rpuNode == nil:
		return nil, fieldErr(n, at+".requests_per_unit", "required unless unlimited: true (0 rejects every request)")
	}
	return rl, nil
}

func eachKey(n *yaml.Node, where string, fn func(string, *yaml.Node) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		if where == "" {
			where = "(top level)"
		}
		return fieldErr(n, where, "want a mapping of keys")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		if seen[k] {
			f := k
			if where != "" {
				f = where + "." + k
			}
			return fieldErr(n.Content[i], f, "duplicate key")
		}
		seen[k] = true
		if err := fn(k, n.Content[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func str(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return "", fieldErr(v, field, "want a string")
	}
	if len(v.Value) > MaxString {
		return "", fieldErr(v, field, "%d bytes, at most %d", len(v.Value), MaxString)
	}
	return v.Value, nil
}

func boolean(v *yaml.Node, field string) (bool, error) {
	if v.Kind == yaml.ScalarNode {
		switch v.Value {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
	}
	return false, fieldErr(v, field, "%q: want true or false", v.Value)
}

// Render writes c in the format Parse reads, keys in a fixed order and
// strings quoted, so the bytes are a function of the configuration alone.
// indent is prepended to every line.
func Render(c *Config, indent string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%sdomain: %s\n", indent, strconv.Quote(c.Domain))
	renderList(&b, indent, c.Descriptors)
	return b.Bytes()
}

func renderList(b *bytes.Buffer, ind string, ds []Descriptor) {
	if len(ds) == 0 {
		return
	}
	fmt.Fprintf(b, "%sdescriptors:\n", ind)
	for i := range ds {
		d := &ds[i]
		fmt.Fprintf(b, "%s  - key: %s\n", ind, strconv.Quote(d.Key))
		in := ind + "    "
		if d.Value != "" {
			fmt.Fprintf(b, "%svalue: %s\n", in, strconv.Quote(d.Value))
		}
		if rl := d.RateLimit; rl != nil {
			fmt.Fprintf(b, "%srate_limit:\n", in)
			if rl.Name != "" {
				fmt.Fprintf(b, "%s  name: %s\n", in, strconv.Quote(rl.Name))
			}
			if len(rl.Replaces) > 0 {
				fmt.Fprintf(b, "%s  replaces:\n", in)
				for _, r := range rl.Replaces {
					fmt.Fprintf(b, "%s    - name: %s\n", in, strconv.Quote(r))
				}
			}
			if rl.Unlimited {
				fmt.Fprintf(b, "%s  unlimited: true\n", in)
			} else {
				fmt.Fprintf(b, "%s  unit: %s\n%s  requests_per_unit: %d\n", in, rl.Unit, in, rl.RequestsPerUnit)
			}
		}
		if d.ShadowMode {
			fmt.Fprintf(b, "%sshadow_mode: true\n", in)
		}
		if d.DetailedMetric {
			fmt.Fprintf(b, "%sdetailed_metric: true\n", in)
		}
		if d.ShareThreshold {
			fmt.Fprintf(b, "%sshare_threshold: true\n", in)
		}
		renderList(b, in, d.Descriptors)
	}
}
