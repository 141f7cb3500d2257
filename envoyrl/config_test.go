package envoyrl

import (
	"errors"
	"strings"
	"testing"
)

// The decisions below follow the reference service's documented format:
// nested descriptors match at the request's depth only; at each level a
// (key, value) descriptor is tried before a key-only one; a key-only level
// gives every distinct value its own counter; a rate_limit-less descriptor is
// a placeholder; unlimited, shadow_mode and replaces as documented.
const cfgYAML = `
domain: shop
descriptors:
  # placeholder level: only its child has a limit
  - key: tier
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: user
        value: vip
        rate_limit: {unit: minute, requests_per_unit: 50}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: path
    value: /api/health
    rate_limit: {unlimited: true}
  - key: internal
  - key: region
    value: eu
    rate_limit: {unit: day, requests_per_unit: 9}
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: team
    value: a
    descriptors:
      - key: op
        value: read
        rate_limit: {name: team_read, unit: second, requests_per_unit: 5}
  - key: team
    value: b
    descriptors:
      - key: op
        value: read
        rate_limit:
          replaces: [{name: team_read}]
          unit: second
          requests_per_unit: 10
`

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

func TestMatchSemantics(t *testing.T) {
	c, err := Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	x := NewIndex(map[string]*Config{c.Domain: c})
	cases := []struct {
		name     string
		domain   string
		desc     []Entry
		wantPath string // "" = no rule applies
		rpu      uint32
		unit     Unit
		unlim    bool
		shadow   bool
		stats    string
	}{
		{"nested default value", "shop", entries("tier", "free", "user", "joe"), "tier_free.user", 5, Minute, false, false, "tier_free.user"},
		{"nested specific value beats default", "shop", entries("tier", "free", "user", "vip"), "tier_free.user_vip", 50, Minute, false, false, "tier_free.user_vip"},
		{"placeholder level alone has no limit", "shop", entries("tier", "free"), "", 0, 0, false, false, ""},
		{"deeper request than config: no match", "shop", entries("user", "joe", "extra", "x"), "", 0, 0, false, false, ""},
		{"top-level default value", "shop", entries("user", "joe"), "user", 1000, Hour, false, false, "user"},
		{"top-level specific value beats default", "shop", entries("user", "banned"), "user_banned", 0, Second, false, false, "user_banned"},
		{"unknown key", "shop", entries("nope", "x"), "", 0, 0, false, false, ""},
		{"unknown value of a value-only key", "shop", entries("tier", "paid", "user", "joe"), "", 0, 0, false, false, ""},
		{"unknown domain", "other", entries("user", "joe"), "", 0, 0, false, false, ""},
		{"prefix value", "shop", entries("path", "/api/orders"), "path_/api/*", 7, Second, false, false, "path_/api/*"},
		{"exact value beats prefix", "shop", entries("path", "/api/health"), "path_/api/health", 0, 0, true, false, "path_/api/health"},
		{"prefix does not match", "shop", entries("path", "/web"), "", 0, 0, false, false, ""},
		{"allow-listed key (no rate_limit)", "shop", entries("internal", "x"), "", 0, 0, false, false, ""},
		{"limit at a level that also nests", "shop", entries("region", "eu"), "region_eu", 9, Day, false, false, "region_eu"},
		{"detailed_metric puts the value in stats", "shop", entries("region", "eu", "user", "ann"), "region_eu.user", 3, Second, false, false, "region_eu.user_ann"},
		{"shadow mode", "shop", entries("canary", "x"), "canary", 1, Second, false, true, "canary"},
		{"keys are case-sensitive", "shop", entries("User", "joe"), "", 0, 0, false, false, ""},
		{"empty descriptor", "shop", nil, "", 0, 0, false, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, stats := x.Match(tc.domain, tc.desc)
			if tc.wantPath == "" {
				if r != nil {
					t.Fatalf("matched %s, want no rule", r.Path)
				}
				return
			}
			if r == nil {
				t.Fatalf("no rule, want %s", tc.wantPath)
			}
			if r.Path != tc.wantPath || r.Limit.RequestsPerUnit != tc.rpu || r.Limit.Unlimited != tc.unlim || r.ShadowMode != tc.shadow || stats != tc.stats {
				t.Fatalf("got path %s rpu %d unit %v unlimited %v shadow %v stats %s", r.Path, r.Limit.RequestsPerUnit, r.Limit.Unit, r.Limit.Unlimited, r.ShadowMode, stats)
			}
			if !tc.unlim && r.Limit.Unit != tc.unit {
				t.Fatalf("unit %v, want %v", r.Limit.Unit, tc.unit)
			}
			if x.RuleByID(r.ID) != r {
				t.Fatal("RuleByID does not find the rule")
			}
		})
	}
}

func TestCounterKeys(t *testing.T) {
	c, err := Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	x := NewIndex(map[string]*Config{c.Domain: c})
	r, _ := x.Match("shop", entries("user", "joe"))
	joe, ann := CounterKey(r, entries("user", "joe")), CounterKey(r, entries("user", "ann"))
	if joe == ann {
		t.Fatal("a key-only level must give each value its own counter")
	}
	if joe != CounterKey(r, entries("user", "joe")) {
		t.Fatal("counter key not deterministic")
	}
	if RuleIDOf(joe) != r.ID || RuleIDOf("acme") != "" {
		t.Fatalf("RuleIDOf(%q) = %q, want %q", joe, RuleIDOf(joe), r.ID)
	}
	// Field boundaries count: ("ab","c") and ("a","bc") differ.
	if CounterKey(r, entries("ab", "c")) == CounterKey(r, entries("a", "bc")) {
		t.Fatal("entries that concatenate alike share a counter")
	}
	// The same rule in another config version keeps its ID.
	c2, err := Parse([]byte(strings.Replace(cfgYAML, "requests_per_unit: 7", "requests_per_unit: 8", 1)))
	if err != nil {
		t.Fatal(err)
	}
	x2 := NewIndex(map[string]*Config{c2.Domain: c2})
	if x2.RuleByID(r.ID) == nil {
		t.Fatal("an unchanged rule changed its ID")
	}
	p1, _ := x.Match("shop", entries("path", "/api/x"))
	p2, _ := x2.Match("shop", entries("path", "/api/x"))
	if p1.ID == p2.ID {
		t.Fatal("a changed limit kept its rule ID")
	}
}

func TestReplaces(t *testing.T) {
	c, err := Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	x := NewIndex(map[string]*Config{c.Domain: c})
	a, _ := x.Match("shop", entries("team", "a", "op", "read"))
	b, _ := x.Match("shop", entries("team", "b", "op", "read"))
	u, _ := x.Match("shop", entries("user", "joe"))
	// Alone, each applies.
	for _, r := range []*Rule{a, b} {
		rs := []*Rule{r}
		Resolve(rs)
		if rs[0] == nil {
			t.Fatalf("%s dropped when alone", r.Path)
		}
	}
	// Together, the replaced one is dropped, in either order; others stay.
	for _, rs := range [][]*Rule{{a, b, u, nil}, {b, a, u, nil}} {
		Resolve(rs)
		var kept []string
		for _, r := range rs {
			if r != nil {
				kept = append(kept, r.Path)
			}
		}
		if len(kept) != 2 || !strings.Contains(strings.Join(kept, ","), "team_b.op_read") || !strings.Contains(strings.Join(kept, ","), "user") {
			t.Fatalf("kept %v, want team_b.op_read and user", kept)
		}
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct{ yaml, field string }{
		{"descriptors: []", "domain"},
		{"domain: d\nfoo: 1", "foo"},
		{"domain: d\ndescriptors:\n  - value: x", "descriptors[0].key"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "descriptors[0].rate_limit.unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}", "descriptors[0].rate_limit.requests_per_unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}", "descriptors[0].rate_limit.requests_per_unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 3}", "descriptors[0].rate_limit.unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "descriptors[0].rate_limit.unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please", "descriptors[0].shadow_mode"},
		{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: a\n        rate_limit: {replaces: [{name: ''}], unit: second, requests_per_unit: 1}", "descriptors[0].descriptors[0].rate_limit.replaces[0].name"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v", "descriptors[1]"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: 'a*b'", "descriptors[0].value"},
		{"domain: d\ndescriptors:\n  - key: k\n    colour: red", "descriptors[0].colour"},
		// Fields of the reference that are refused, naming them.
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}", "descriptors[0].rate_limit.requests_per_unit"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, replaces: [{name: a}], unit: second, requests_per_unit: 1}", "descriptors[0].rate_limit.replaces[0].name"},
		{"domain: d\ndescriptors:\n  - key: k\n    value_to_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}", "descriptors[0].value_to_metric"},
		{"domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}", "descriptors[0].quota_mode"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}", "descriptors[0].share_threshold"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: '*a'", "descriptors[0].value"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.yaml))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Parse(%q) = %v, want an error naming %s", tc.yaml, err, tc.field)
		}
	}
}

func TestRenderIsCanonical(t *testing.T) {
	c, err := Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	out := Render(c, "")
	c2, err := Parse(out)
	if err != nil {
		t.Fatalf("rendered config does not parse: %v\n%s", err, out)
	}
	if string(Render(c2, "")) != string(out) {
		t.Fatal("render → parse → render changed the bytes")
	}
	odd := &Config{Domain: "d: \"x\"\n", Descriptors: []Descriptor{{Key: "k\x00", Value: "é*", RateLimit: &RateLimit{Unit: Day, RequestsPerUnit: 1}}}}
	back, err := Parse(Render(odd, ""))
	if err != nil || back.Domain != odd.Domain || back.Descriptors[0].Key != "k\x00" || back.Descriptors[0].Value != "é*" {
		t.Fatalf("odd strings did not survive: %v %+v", err, back)
	}
}

// The reference's units, week, month and year included (a month is 30
// days, a year 365, as the reference counts them), parse and render.
func TestUnitsOfTheReference(t *testing.T) {
	want := map[string]int64{"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800, "month": 2592000, "year": 31536000}
	for name, secs := range want {
		c, err := Parse([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + strings.ToUpper(name) + ", requests_per_unit: 3}"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		u := c.Descriptors[0].RateLimit.Unit
		if u.Seconds() != secs || u.String() != name {
			t.Fatalf("%s: %v, %d s", name, u, u.Seconds())
		}
		back, err := Parse(Render(c, ""))
		if err != nil || back.Descriptors[0].RateLimit.Unit != u {
			t.Fatalf("%s does not render back: %v", name, err)
		}
	}
}

// share_threshold: every value a prefix matches counts in one counter;
// without it, one counter per value.
func TestShareThreshold(t *testing.T) {
	c, err := Parse([]byte("domain: d\ndescriptors:\n  - key: path\n    value: /a/*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: path\n    value: /b/*\n    rate_limit: {unit: minute, requests_per_unit: 2}"))
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(Render(c, ""))
	if err != nil || !back.Descriptors[0].ShareThreshold {
		t.Fatalf("share_threshold does not render back: %v", err)
	}
	x := NewIndex(map[string]*Config{"d": c})
	key := func(v string) string {
		es := []Entry{{"path", v}}
		r, _ := x.Match("d", es)
		if r == nil {
			t.Fatalf("%s matches nothing", v)
		}
		return CounterKey(r, es)
	}
	if key("/a/1") != key("/a/2") {
		t.Fatal("share_threshold: /a/1 and /a/2 have different counters")
	}
	if key("/b/1") == key("/b/2") {
		t.Fatal("no share_threshold: /b/1 and /b/2 share a counter")
	}
}

// An override's rule is read back from its ID while its domain is
// configured, with the limit it carries.
func TestOverrideRule(t *testing.T) {
	x := NewIndex(map[string]*Config{"d": {Domain: "d"}})
	r := OverrideRule("d", Week, 7, []string{"k"})
	got := x.RuleByID(r.ID)
	if got == nil || got.Limit.Unit != Week || got.Limit.RequestsPerUnit != 7 || RuleIDOf(CounterKey(r, []Entry{{"k", "v"}})) != r.ID {
		t.Fatalf("override %q read back as %+v", r.ID, got)
	}
	if NewIndex(map[string]*Config{"e": {Domain: "e"}}).RuleByID(r.ID) != nil {
		t.Fatal("an override resolves where its domain is not configured")
	}
}
