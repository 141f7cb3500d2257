package envoyrl

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Rule is one descriptor with a rate_limit, resolved for matching.
type Rule struct {
	// ID identifies the rule across nodes and config versions: a hash of
	// its domain, its path of keys and values and its limit, so a node
	// deciding and the node owning a counter agree on the rule as long as
	// they hold the same rule, whatever else changed in the file.
	ID     string
	Domain string
	// Path is the rule's place in the tree, "key_value.key" as the
	// reference service names it in statistics.
	Path           string
	Limit          RateLimit
	ShadowMode     bool
	DetailedMetric bool
	wildcard       bool // reached through at least one default or prefix match
	// share: per level of the rule's path, the prefix pattern ("abc*") that
	// stands for the request's value in the counter key (share_threshold),
	// or "" for the value itself. nil when no level shares.
	share    []string
	override bool
}

// Rate is the rule's limit as a token bucket: requests_per_unit per unit,
// and a bucket of one unit's worth.
func (r *Rule) Rate() (perSecond float64, burst int64) {
	if r.Limit.Unlimited || r.Limit.RequestsPerUnit == 0 {
		return 0, 0
	}
	return float64(r.Limit.RequestsPerUnit) / float64(r.Limit.Unit.Seconds()), int64(r.Limit.RequestsPerUnit)
}

// Sliding says whether the rule is enforced as a sliding window of one unit
// (requests_per_unit in any window of the unit's length) rather than as a
// token bucket: units longer than a second, and per-second rules of at most
// SlidingPerSecondMax (decided by the key's owner, request by request). A
// busier per-second rule keeps the bucket, whose leases follow demand
// within a report period with no call.
func (r *Rule) Sliding() bool {
	if r.Limit.Unlimited || r.Limit.RequestsPerUnit == 0 {
		return false
	}
	return r.Limit.Unit.Seconds() > 1 || r.Limit.RequestsPerUnit <= SlidingPerSecondMax
}

// SlidingPerSecondMax is the largest per-second rule enforced as a sliding
// window. A one-second window gets no leases (their tokens reach the
// owner's log up to two report periods late, a fifth of the window), so
// each request is one call to the owner; a bucket's leases split a few
// tokens a second among nodes in fractions of a token, refusing a client
// well below the limit (5/s over three nodes at 90%: 9 of 46 admitted).
const SlidingPerSecondMax = 50

// Entry is one (key, value) of a request's descriptor.
type Entry struct{ Key, Value string }

type node struct {
	exact  map[[2]string]*branch // (key, value)
	any    map[string]*branch    // key with no value
	prefix map[string][]prefixed // key → values ending in '*', in file order
}

type prefixed struct {
	prefix string
	b      *branch
}

type branch struct {
	rule     *Rule // nil: a placeholder or allow-listed descriptor
	detailed bool
	next     *node
}

// Index matches requests against a set of domains' configurations. It is
// immutable once built and safe for concurrent use.
type Index struct {
	domains map[string]*node
	byID    map[string]*Rule
}

// NewIndex builds the index of the given configurations (one per domain).
func NewIndex(cfgs map[string]*Config) *Index {
	x := &Index{domains: map[string]*node{}, byID: map[string]*Rule{}}
	for domain, c := range cfgs {
		x.domains[domain] = x.build(domain, "", c.Descriptors, false, nil)
	}
	return x
}

func (x *Index) build(domain, path string, ds []Descriptor, wild bool, share []string) *node {
	n := &node{exact: map[[2]string]*branch{}, any: map[string]*branch{}, prefix: map[string][]prefixed{}}
	for i := range ds {
		d := &ds[i]
		p := d.Key
		if d.Value != "" {
			p += "_" + d.Value
		}
		if path != "" {
			p = path + "." + p
		}
		w := wild || d.Value == "" || strings.HasSuffix(d.Value, "*")
		b := &branch{detailed: d.DetailedMetric}
		sh := append(share[:len(share):len(share)], "")
		if d.ShareThreshold {
			sh[len(sh)-1] = d.Value
		}
		if d.RateLimit != nil {
			r := &Rule{Domain: domain, Path: p, Limit: *d.RateLimit, ShadowMode: d.ShadowMode, DetailedMetric: d.DetailedMetric, wildcard: w}
			r.ID = ruleID(domain, p, d.RateLimit)
			if slices.ContainsFunc(sh, func(v string) bool { return v != "" }) {
				r.share = sh
			}
			b.rule = r
			x.byID[r.ID] = r
		}
		if len(d.Descriptors) > 0 {
			b.next = x.build(domain, p, d.Descriptors, w, sh)
		}
		switch {
		case d.Value == "":
			n.any[d.Key] = b
		case strings.HasSuffix(d.Value, "*"):
			n.prefix[d.Key] = append(n.prefix[d.Key], prefixed{prefix: strings.TrimSuffix(d.Value, "*"), b: b})
		default:
			n.exact[[2]string{d.Key, d.Value}] = b
		}
	}
	return n
}

// RuleByID returns the rule with an ID (see Rule.ID), nil if this index has
// none. An override's ID (OverrideRule) is the rule itself: it resolves
// whenever its domain is configured.
func (x *Index) RuleByID(id string) *Rule {
	if r := x.byID[id]; r != nil {
		return r
	}
	if r := ruleFromOverrideID(id); r != nil && x.hasDomainHash(id) {
		return r
	}
	return nil
}

// OverrideRule is the rule of a request descriptor that carries its own
// limit (the descriptor's limit field, which Envoy sends from its route
// configuration): the reference service enforces that limit in place of the
// configured one, in a counter of its own, never in shadow mode. keys are
// the descriptor's keys, for the rule's name in statistics (values are left
// out: they would make the metric's cardinality unbounded). The ID encodes
// the limit, so the key's owner reads it from the counter key alone.
func OverrideRule(domain string, unit Unit, rpu uint32, keys []string) *Rule {
	h := uint64(offset64)
	for i := 0; i < len(domain); i++ {
		h = (h ^ uint64(domain[i])) * prime64
	}
	id := fmt.Sprintf("o%1x%08x%06x", int(unit)&0xf, rpu, h&0xffffff)
	r := ruleFromOverrideID(id)
	r.Domain = domain
	r.Path = "override." + strings.Join(keys, ".")
	return r
}

// ruleFromOverrideID reads an override rule's limit from its ID (nil: not
// one). Its Domain is known only through the hash: RuleByID checks it.
func ruleFromOverrideID(id string) *Rule {
	if len(id) != 16 || id[0] != 'o' {
		return nil
	}
	unit, err1 := strconv.ParseUint(id[1:2], 16, 8)
	rpu, err2 := strconv.ParseUint(id[2:10], 16, 32)
	if err1 != nil || err2 != nil || Unit(unit).Seconds() == 0 {
		return nil
	}
	return &Rule{ID: id, Limit: RateLimit{Unit: Unit(unit), RequestsPerUnit: uint32(rpu)}, Path: "override", override: true}
}

// HasDomain says whether a domain is configured.
func (x *Index) HasDomain(domain string) bool { return x.domains[domain] != nil }

// hasDomainHash says whether a configured domain has the override ID's
// domain hash.
func (x *Index) hasDomainHash(id string) bool {
	for d := range x.domains {
		if r := OverrideRule(d, Second, 0, nil); r.ID[10:] == id[10:] {
			return true
		}
	}
	return false
}

// Match finds the rule of one request descriptor: the rule at the same depth
// as the descriptor has entries, reached by matching each entry against its
// level, key and value first, then a value prefix ("v*"), then the key alone.
// It returns nil when no rule applies (no such path, or a placeholder without
// a rate_limit at that depth). statsKey is the rule's name in statistics:
// its Path, with the request's values in place of value-less and prefix levels
// where the descriptor asks for detailed_metric.
func (x *Index) Match(domain string, entries []Entry) (r *Rule, statsKey string) {
	n := x.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil, ""
	}
	var detailed []string
	var b *branch
	for i, e := range entries {
		if n == nil {
			return nil, ""
		}
		b = n.exact[[2]string{e.Key, e.Value}]
		seg := e.Key + "_" + e.Value
		if b == nil {
			for _, p := range n.prefix[e.Key] {
				if strings.HasPrefix(e.Value, p.prefix) {
					if b = p.b; !b.detailed {
						seg = e.Key + "_" + p.prefix + "*" // the rule's spelling: bounded cardinality
					}
					break
				}
			}
		}
		if b == nil {
			if b = n.any[e.Key]; b != nil && !b.detailed {
				seg = e.Key
			}
		}
		if b == nil {
			return nil, ""
		}
		detailed = append(detailed, seg)
		if i < len(entries)-1 {
			n = b.next
		}
	}
	if b.rule == nil {
		return nil, ""
	}
	if !b.rule.wildcard {
		return b.rule, b.rule.Path
	}
	return b.rule, strings.Join(detailed, ".")
}

// CounterKey names the counter one request descriptor is counted in: the
// rule, and every entry's actual value, so a value-less level gives each
// distinct value a counter of its own (per remote address, per user). It is
// the same on every node and valid as a rate key (api.ValidateTenantID): a
// reserved prefix, the rule's ID and a 128-bit hash of the entries.
func CounterKey(r *Rule, entries []Entry) string {
	h1, h2 := uint64(offset64), uint64(offset64b)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h1 = (h1 ^ uint64(s[i])) * prime64
			h2 = (h2 ^ uint64(s[i])) * prime64
		}
		// A length byte separates fields, so ("ab","c") ≠ ("a","bc").
		h1 = (h1 ^ uint64(len(s)&0xff)) * prime64
		h2 = (h2 ^ uint64(len(s)>>8&0xff)) * prime64
	}
	for i, e := range entries {
		mix(e.Key)
		if i < len(r.share) && r.share[i] != "" {
			mix(r.share[i]) // share_threshold: one counter for the prefix
			continue
		}
		mix(e.Value)
	}
	var buf [len(KeyPrefix) + 16 + 1 + 32]byte
	n := copy(buf[:], KeyPrefix)
	n += copy(buf[n:], r.ID)
	buf[n] = '.'
	n++
	var hb [16]byte
	binary.BigEndian.PutUint64(hb[:8], h1)
	binary.BigEndian.PutUint64(hb[8:], h2)
	hex.Encode(buf[n:], hb[:])
	return string(buf[:])
}

// KeyPrefix starts every counter key (CounterKey): rate keys with this prefix
// are Envoy rate limit counters, whose limit comes from the rule named in the
// key, not from a tenant's ingestion_rate.
const KeyPrefix = "!rls."

// RuleIDOf extracts the rule ID from a counter key ("" when s is not one).
func RuleIDOf(s string) string {
	rest, ok := strings.CutPrefix(s, KeyPrefix)
	if !ok || len(rest) != 16+1+32 || rest[16] != '.' {
		return ""
	}
	return rest[:16]
}

const (
	offset64  = 14695981039346656037
	offset64b = 0x9e3779b97f4a7c15
	prime64   = 1099511628211
)

func ruleID(domain, path string, rl *RateLimit) string {
	h := uint64(offset64)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime64
		}
		h = (h ^ 0xff) * prime64
	}
	mix(domain)
	mix(path)
	mix(rl.Unit.String())
	var nb [8]byte
	binary.BigEndian.PutUint64(nb[:], uint64(rl.RequestsPerUnit))
	mix(string(nb[:]))
	if rl.Unlimited {
		mix("unlimited")
	}
	var out [8]byte
	binary.BigEndian.PutUint64(out[:], h)
	return hex.EncodeToString(out[:])
}

// Resolve applies replaces across the rules one request matched (nil entries
// are descriptors that matched none): a rule whose name another matched
// rule replaces is dropped (set to nil). The reference service's rule: when
// limits match both, only the replacing one takes effect.
func Resolve(rules []*Rule) {
	var replaced []string
	for _, r := range rules {
		if r != nil {
			replaced = append(replaced, r.Limit.Replaces...)
		}
	}
	if len(replaced) == 0 {
		return
	}
	for i, r := range rules {
		if r != nil && r.Limit.Name != "" && slices.Contains(replaced, r.Limit.Name) {
			rules[i] = nil
		}
	}
}
