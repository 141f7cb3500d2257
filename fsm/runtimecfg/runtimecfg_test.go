package runtimecfg

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

const sampleYAML = `
version: 3
defaults:
  max_series: 150000
  sample_rates:
    locate: 100
tenants:
  acme:
    max_series: 1000000
    ingestion_rate: 5000.5
    ingestion_burst: 10000
    max_series_per_partition: 20000
    sample_rates:
      submit: 25
  tenant-b:
    unlimited: true
  "dot.ted":
    ingestion_rate: 1
  empty: {}
global:
  sample_rates:
    locate: 50
  backlog_controller: {kind: locate, target: 10000, period: 10s, kp: 0.002, ki: 0, min_percent: 1}
`

func mustParse(t *testing.T, s string) *Document {
	t.Helper()
	d, _, err := ParseYAML([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestParseYAMLAndEffective(t *testing.T) {
	d, exp, err := ParseYAML([]byte(sampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	if exp == nil || *exp != 3 {
		t.Fatalf("expected version %v, want 3", exp)
	}
	base := Effective{MaxSeries: 7, IngestionBurst: 9}
	if e := d.For("acme", base); e != (Effective{MaxSeries: 1_000_000, MaxSeriesPerPartition: 20000, IngestionRate: 5000.5, IngestionBurst: 10000}) {
		t.Errorf("acme: %+v", e)
	}
	if e := d.For("tenant-b", base); e.MaxSeries != 0 || e.IngestionBurst != 9 {
		t.Errorf("tenant-b: %+v", e)
	}
	if e := d.For("other", base); e.MaxSeries != 150000 {
		t.Errorf("other: %+v", e)
	}
	if _, ok := d.Tenants["empty"]; ok {
		t.Error("a tenant without keys was kept")
	}
	if got := d.SampleRate("acme", "submit"); got != 25 {
		t.Errorf("acme submit %v", got)
	}
	if got := d.SampleRate("acme", "locate"); got != 100 {
		t.Errorf("acme locate %v (defaults)", got)
	}
	if got := d.SampleRate("x", "other"); got != 100 {
		t.Errorf("unset kind %v", got)
	}
	if got := d.GlobalSampleRate("locate"); got != 50 {
		t.Errorf("global locate %v", got)
	}
	bc := d.Global.BacklogController
	if bc == nil || bc.Period != 10*time.Second || bc.Kp != 0.002 || bc.Kind != "locate" {
		t.Errorf("controller %+v", bc)
	}

	// Render → parse gives the same settings and bytes (a fixed point).
	d.Version = 42
	out := RenderYAML(d)
	d2, exp2, err := ParseYAML(out)
	if err != nil {
		t.Fatalf("rendered YAML does not parse: %v\n%s", err, out)
	}
	if *exp2 != 42 || !SameContent(d, d2) {
		t.Fatalf("render/parse changed the document:\n%s", out)
	}
	d2.Version = 42
	if !bytes.Equal(RenderYAML(d2), out) {
		t.Fatal("render is not a fixed point")
	}
}

// Every bad value is refused with the field named; nothing partial comes back.
func TestValidationNamesTheField(t *testing.T) {
	cases := []struct{ yaml, field string }{
		{"tenants:\n  acme:\n    ingestion_rate: -1\n", "tenants.acme.ingestion_rate"},
		{"tenants:\n  acme:\n    ingestion_rate: abc\n", "tenants.acme.ingestion_rate"},
		{"tenants:\n  acme:\n    ingestion_rate: .nan\n", "tenants.acme.ingestion_rate"},
		{"defaults:\n  max_series: -5\n", "defaults.max_series"},
		{"defaults:\n  max_series: 1.5\n", "defaults.max_series"},
		{"defaults:\n  max_sereis: 5\n", "defaults.max_sereis"},
		{"tenants:\n  acme:\n    ingestion_burst: -2\n", "tenants.acme.ingestion_burst"},
		{"tenants:\n  acme:\n    max_series_per_partition: -2\n", "tenants.acme.max_series_per_partition"},
		{"tenants:\n  acme:\n    sample_rates:\n      locate: 101\n", "tenants.acme.sample_rates.locate"},
		{"tenants:\n  acme:\n    sample_rates:\n      Bad Kind: 5\n", "tenants.acme.sample_rates.Bad Kind"},
		{"tenants:\n  acme:\n    unlimited: true\n    max_series: 5\n", "tenants.acme.unlimited"},
		{"tenants:\n  \"bad tenant\":\n    max_series: 5\n", `tenants.bad tenant`},
		{"global:\n  sample_rates:\n    locate: -1\n", "global.sample_rates.locate"},
		{"global:\n  backlog_controller: {kind: locate, target: 0, period: 1s, kp: 1}\n", "global.backlog_controller.target"},
		{"global:\n  backlog_controller: {kind: locate, target: 5, period: 1us, kp: 1}\n", "global.backlog_controller.period"},
		{"global:\n  backlog_controller: {kind: locate, target: 5, period: 1s, kp: 0}\n", "global.backlog_controller.kp"},
		{"global:\n  backlog_controller: {kind: locate, target: 5, period: 1s, kp: 1, ki: -1}\n", "global.backlog_controller.ki"},
		{"global:\n  backlog_controller: {kind: locate, target: 5, period: 1s, kp: 1, min_percent: 200}\n", "global.backlog_controller.min_percent"},
		{"global:\n  backlog_controller: {target: 5, period: 1s, kp: 1}\n", "global.backlog_controller.kind"},
		{"global:\n  foo: 1\n", "global.foo"},
		{"tenant:\n  acme: {}\n", "tenant"},
		{"defaults:\n  max_series: 1\n  max_series: 2\n", "defaults.max_series"},
		{"version: -1\n", "version"},
	}
	for _, tc := range cases {
		_, _, err := ParseYAML([]byte(tc.yaml))
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%q: error %v is not a FieldError", tc.yaml, err)
			continue
		}
		if fe.Field != tc.field {
			t.Errorf("%q: field %q, want %q (%v)", tc.yaml, fe.Field, tc.field, err)
		}
	}
	if _, _, err := ParseYAML([]byte("defaults: [1, 2")); err == nil {
		t.Error("broken YAML accepted")
	}
}

func TestPatch(t *testing.T) {
	d := mustParse(t, sampleYAML)
	d.Version = 5
	n, err := d.ApplyPatch(Patch{Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{
		{Kind: OpSet, Key: "max_series", Value: "7"},
		{Kind: OpUnset, Key: "ingestion_rate"},
		{Kind: OpSet, Key: "sample_rates.locate", Value: "12.5"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if e := n.For("acme", Effective{}); e.MaxSeries != 7 || e.IngestionRate != 0 {
		t.Fatalf("patched acme %+v", e)
	}
	if n.SampleRate("acme", "locate") != 12.5 || n.Version != 5 {
		t.Fatalf("patched sample rate / version: %v %d", n.SampleRate("acme", "locate"), n.Version)
	}
	if d.For("acme", Effective{}).MaxSeries != 1_000_000 {
		t.Fatal("patch changed the original document")
	}
	// Clearing a tenant removes it; a new tenant appears.
	n, err = n.ApplyPatch(Patch{Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{{Kind: OpClear}}})
	if err != nil || n.Tenants["acme"].MaxSeries != nil {
		t.Fatalf("clear: %v %+v", err, n.Tenants["acme"])
	}
	if _, ok := n.Tenants["acme"]; ok {
		t.Fatal("cleared tenant still listed")
	}
	n, err = n.ApplyPatch(Patch{Target: Target{Kind: TargetGlobal}, Ops: []Op{
		{Kind: OpSet, Key: "sample_rates.submit", Value: "10"}, {Kind: OpUnset, Key: "backlog_controller"}}})
	if err != nil || n.GlobalSampleRate("submit") != 10 || n.Global.BacklogController != nil {
		t.Fatalf("global patch: %v %+v", err, n.Global)
	}
	// A bad value names the field; a partially valid patch changes nothing.
	for _, tc := range []struct {
		p     Patch
		field string
	}{
		{Patch{Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}, {Kind: OpSet, Key: "ingestion_rate", Value: "-1"}}}, "tenants.acme.ingestion_rate"},
		{Patch{Target: Target{Kind: TargetDefaults}, Ops: []Op{{Kind: OpSet, Key: "nope", Value: "1"}}}, "defaults.nope"},
		{Patch{Target: Target{Kind: TargetTenant, Tenant: "a b"}, Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "1"}}}, "tenants.a b"},
		{Patch{Target: Target{Kind: TargetGlobal}, Ops: []Op{{Kind: OpSet, Key: "backlog_controller.target", Value: "-1"}}}, "global.backlog_controller.target"},
	} {
		_, err := d.ApplyPatch(tc.p)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("patch %+v: error %v, want field %s", tc.p, err, tc.field)
		}
	}
	// A controller needs its kind, target, period and kp in one change.
	_, err = (&Document{}).ApplyPatch(Patch{Target: Target{Kind: TargetGlobal}, Ops: []Op{{Kind: OpSet, Key: "backlog_controller.kp", Value: "1"}}})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "global.backlog_controller.kind" {
		t.Errorf("partial controller: %v", err)
	}
}

func TestCodecRoundTripAndCanonical(t *testing.T) {
	d := mustParse(t, sampleYAML)
	d.Version = 9
	b := AppendDocument(nil, d)
	d2, err := DecodeDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	if d2.Version != 9 || !SameContent(d, d2) || !bytes.Equal(AppendDocument(nil, d2), b) {
		t.Fatal("document does not round-trip")
	}
	empty, err := DecodeDocument(AppendDocument(nil, &Document{}))
	if err != nil || empty.Version != 0 || len(Flatten(empty)) != 0 {
		t.Fatalf("empty document: %v %+v", err, empty)
	}
	// Every strict prefix is refused, and so is a trailing byte.
	for i := range b {
		if _, err := DecodeDocument(b[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix of %d bytes: %v", i, err)
		}
	}
	if _, err := DecodeDocument(append(b[:len(b):len(b)], 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatal("trailing byte accepted")
	}
	a := Apply{Expected: 4, NewVersion: 5, Force: true, Doc: d}
	ga, err := DecodeApply(AppendApply(nil, a))
	if err != nil || ga.Expected != 4 || ga.NewVersion != 5 || !ga.Force || !SameContent(ga.Doc, d) || ga.Doc.Version != 5 {
		t.Fatalf("apply round trip: %v %+v", err, ga)
	}
	p := Patch{HasExpected: true, Expected: 3, Target: Target{Kind: TargetTenant, Tenant: "acme"}, Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}, {Kind: OpClear}}}
	gp, err := DecodePatch(AppendPatch(nil, p))
	if err != nil || !gp.HasExpected || gp.Expected != 3 || gp.Target != p.Target || len(gp.Ops) != 2 || gp.Ops[0] != p.Ops[0] {
		t.Fatalf("patch round trip: %v %+v", err, gp)
	}
}

func TestFlattenOrder(t *testing.T) {
	d := mustParse(t, sampleYAML)
	var keys []string
	for _, kv := range Flatten(d) {
		keys = append(keys, kv.Key)
	}
	got := strings.Join(keys, " ")
	for _, want := range []string{"defaults.max_series", `tenants."dot.ted".ingestion_rate`, "tenants.acme.sample_rates.submit", "global.backlog_controller.period"} {
		if !strings.Contains(got, want) {
			t.Errorf("flatten lacks %s: %s", want, got)
		}
	}
}

// TestParseYAMLQuotedNumber: a quoted limit is a string, refused naming the
// field (and the line), not read as the number.
func TestParseYAMLQuotedNumber(t *testing.T) {
	for _, c := range []struct{ doc, field string }{
		{"defaults:\n  max_series: \"10\"\n", "defaults.max_series"},
		{"tenants:\n  a:\n    max_series: '10'\n", "tenants.a.max_series"},
		{"tenants:\n  a:\n    ingestion_rate: \"1.5\"\n", "tenants.a.ingestion_rate"},
		{"tenants:\n  a:\n    unlimited: \"true\"\n", "tenants.a.unlimited"},
		{"global:\n  sample_rates:\n    locate: \"50\"\n", "global.sample_rates.locate"},
	} {
		_, _, err := ParseYAML([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), "quoted") {
			t.Errorf("%q: %v, want an error naming %s as quoted", c.doc, err, c.field)
		}
	}
	if d, _, err := ParseYAML([]byte("defaults:\n  max_series: 10\n")); err != nil || *d.Defaults.MaxSeries != 10 {
		t.Fatalf("plain number: %v", err)
	}
}
