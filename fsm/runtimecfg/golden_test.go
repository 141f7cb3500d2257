package runtimecfg

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tollgate-io/tollgate/limits"
)

// Golden byte forms of the document (the snapshot section) and of the entry
// payloads, recorded from the encoders as they were before the codec moved
// to fsm/wire. Entries and snapshots outlive builds: a change here is a
// format change.
func TestGoldenBytes(t *testing.T) {
	d := mustParse(t, sampleYAML)
	d.Version = 300
	p := Patch{HasExpected: true, Expected: 299, Target: Target{Kind: TargetTenant, Tenant: "acme"},
		Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}, {Kind: OpUnset, Key: "ingestion_rate"}, {Kind: OpClear}}}
	for _, x := range []struct {
		name, want string
		b          []byte
		again      func([]byte) ([]byte, error)
	}{
		{"document", "ac0201f0930901066c6f636174650000000000005940030461636d650fc0843da09c01000000008088b340904e01067375626d6974000000000000394007646f742e74656404000000000000f03f000874656e616e742d6201000001066c6f63617465000000000000494001066c6f63617465000000000088c340904efca9f1d24d62603f0000000000000000000000000000f03f", AppendDocument(nil, d), func(b []byte) ([]byte, error) {
			v, err := DecodeDocument(b)
			if err != nil {
				return nil, err
			}
			return AppendDocument(nil, v), nil
		}},
		{"empty document", "010000000000", AppendDocument(nil, &Document{Version: 1}), func(b []byte) ([]byte, error) {
			v, err := DecodeDocument(b)
			if err != nil {
				return nil, err
			}
			return AppendDocument(nil, v), nil
		}},
		{"apply", "01ab02ac0201f0930901066c6f636174650000000000005940030461636d650fc0843da09c01000000008088b340904e01067375626d6974000000000000394007646f742e74656404000000000000f03f000874656e616e742d6201000001066c6f63617465000000000000494001066c6f63617465000000000088c340904efca9f1d24d62603f0000000000000000000000000000f03f", AppendApply(nil, Apply{Expected: 299, NewVersion: 300, Force: true, Doc: d}), func(b []byte) ([]byte, error) {
			v, err := DecodeApply(b)
			if err != nil {
				return nil, err
			}
			return AppendApply(nil, v), nil
		}},
		{"patch", "01ab02010461636d6503010a6d61785f7365726965730135020e696e67657374696f6e5f7261746500030000", AppendPatch(nil, p), func(b []byte) ([]byte, error) { v, err := DecodePatch(b); return AppendPatch(nil, v), err }},
		{"patch defaults", "000000", AppendPatch(nil, Patch{Target: Target{Kind: TargetDefaults}}), func(b []byte) ([]byte, error) {
			v, err := DecodePatch(b)
			return AppendPatch(nil, v), err
		}},
	} {
		if got := hex.EncodeToString(x.b); got != x.want {
			t.Errorf("%s: %s, want %s", x.name, got, x.want)
			continue
		}
		if again, err := x.again(x.b); err != nil || !bytes.Equal(again, x.b) {
			t.Errorf("%s: golden bytes decode to %x, %v", x.name, again, err)
		}
	}
}

// TestEmbeddedOverridesKeepForms: Scope embeds limits.Overrides (the limit
// keys). The fixtures below were produced by the code before the embedding,
// when Scope declared the four fields itself: the snapshot section's bytes
// decode to the same values, and the YAML, the flat form, the JSON and the
// messages naming fields are unchanged byte for byte.
func TestEmbeddedOverridesKeepForms(t *testing.T) {
	const (
		oldDocument = "ac0201f0930901066c6f636174650000000000005940030461636d650fc0843da09c01000000008088b340904e01067375626d6974000000000000394007646f742e74656404000000000000f03f000874656e616e742d6201000001066c6f63617465000000000000494001066c6f63617465000000000088c340904efca9f1d24d62603f0000000000000000000000000000f03f"
		oldYAML     = "version: 300\ndefaults:\n  max_series: 150000\n  sample_rates:\n    locate: 100\ntenants:\n  acme:\n    max_series: 1000000\n    max_series_per_partition: 20000\n    ingestion_rate: 5000.5\n    ingestion_burst: 10000\n    sample_rates:\n      submit: 25\n  dot.ted:\n    ingestion_rate: 1\n  tenant-b:\n    max_series: 0\nglobal:\n  sample_rates:\n    locate: 50\n  backlog_controller:\n    kind: locate\n    target: 10000\n    period: 10s\n    kp: 0.002\n    ki: 0\n    min_percent: 1\n"
		oldFlat     = `[{defaults.max_series 150000} {defaults.sample_rates.locate 100} {tenants.acme.max_series 1000000} {tenants.acme.max_series_per_partition 20000} {tenants.acme.ingestion_rate 5000.5} {tenants.acme.ingestion_burst 10000} {tenants.acme.sample_rates.submit 25} {tenants."dot.ted".ingestion_rate 1} {tenants.tenant-b.max_series 0} {global.sample_rates.locate 50} {global.backlog_controller.kind locate} {global.backlog_controller.target 10000} {global.backlog_controller.period 10s} {global.backlog_controller.kp 0.002} {global.backlog_controller.ki 0} {global.backlog_controller.min_percent 1}]`
		oldJSON     = `{"defaults":{"MaxSeries":150000,"MaxSeriesPerPartition":null,"IngestionRate":null,"IngestionBurst":null,"SampleRates":{"locate":100}},"tenants":{"acme":{"MaxSeries":1000000,"MaxSeriesPerPartition":20000,"IngestionRate":5000.5,"IngestionBurst":10000,"SampleRates":{"submit":25}},"dot.ted":{"MaxSeries":null,"MaxSeriesPerPartition":null,"IngestionRate":1,"IngestionBurst":null,"SampleRates":null},"tenant-b":{"MaxSeries":0,"MaxSeriesPerPartition":null,"IngestionRate":null,"IngestionBurst":null,"SampleRates":null}}}`
	)
	b, _ := hex.DecodeString(oldDocument)
	d, err := DecodeDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	acme := d.Tenants["acme"].Overrides
	want := limits.Effective{MaxSeries: 1_000_000, MaxSeriesPerPartition: 20_000, IngestionRate: 5000.5, IngestionBurst: 10_000}
	if got := limits.Resolve(limits.Effective{}, acme); got != want {
		t.Errorf("acme decoded as %+v, want %+v", got, want)
	}
	if got := d.For("tenant-b", limits.Effective{MaxSeries: 7}); got.MaxSeries != 0 || d.Tenants["tenant-b"].MaxSeries == nil {
		t.Errorf("tenant-b (unlimited) decoded as %+v", got)
	}
	if got := d.For("nobody", limits.Effective{IngestionRate: 3}); got != (limits.Effective{MaxSeries: 150_000, IngestionRate: 3}) {
		t.Errorf("defaults decoded as %+v", got)
	}
	if got := string(RenderYAML(d)); got != oldYAML {
		t.Errorf("YAML changed:\n%s\nwant\n%s", got, oldYAML)
	}
	if got := fmt.Sprint(Flatten(d)); got != oldFlat {
		t.Errorf("flat form changed:\n%s\nwant\n%s", got, oldFlat)
	}
	j, err := json.Marshal(map[string]any{"defaults": d.Defaults, "tenants": d.Tenants})
	if err != nil || string(j) != oldJSON {
		t.Errorf("JSON changed (%v):\n%s\nwant\n%s", err, j, oldJSON)
	}
	if again := hex.EncodeToString(AppendDocument(nil, d)); again != oldDocument {
		t.Errorf("re-encoded as %s", again)
	}
}

// TestFieldMessagesUnchanged: errors name fields with the limits.Key*
// constants now; the messages are those the spelled-out keys gave (recorded
// before the change), since operators and scripts read them.
func TestFieldMessagesUnchanged(t *testing.T) {
	d := mustParse(t, sampleYAML)
	for in, want := range map[string]string{
		"defaults: {max_series: -1}":                     "defaults.max_series: -1 must be ≥ 0 (0 = unlimited) (line 1)",
		"defaults: {max_series_per_partition: -1}":       "defaults.max_series_per_partition: -1 must be ≥ 0 (0 = off) (line 1)",
		"tenants: {a: {ingestion_rate: -1}}":             "tenants.a.ingestion_rate: -1 must be a finite number in [0, 1e+15] (per second; 0 = off) (line 1)",
		"tenants: {a: {ingestion_burst: -1}}":            "tenants.a.ingestion_burst: -1 must be ≥ 0 (line 1)",
		"tenants: {a: {unlimited: maybe}}":               `tenants.a.unlimited: "maybe" is not true or false (line 1)`,
		"tenants: {a: {unlimited: true, max_series: 5}}": "tenants.a.unlimited: true contradicts max_series = 5; keep one (line 1)",
		"tenants: {a: {nope: 1}}":                        "tenants.a.nope: unknown key (keys: max_series, max_series_per_partition, ingestion_rate, ingestion_burst, unlimited, sample_rates.<kind>) (line 1)",
		"tenants: {a: {sample_rates: {locate: 101}}}":    "tenants.a.sample_rates.locate: 101 must be a percentage in [0, 100] (line 1)",
		"global: {sample_rates: {locate: -1}}":           "global.sample_rates.locate: -1 must be a percentage in [0, 100] (line 1)",
		"global: {nope: 1}":                              "global.nope: unknown key (keys: sample_rates, backlog_controller) (line 1)",
	} {
		if _, _, err := ParseYAML([]byte(in)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", in, err, want)
		}
	}
	for _, c := range []struct {
		target Target
		op     Op
		want   string
	}{
		{Target{Kind: TargetTenant, Tenant: "acme"}, Op{Kind: OpSet, Key: "nope", Value: "1"}, "tenants.acme.nope: unknown key (keys: max_series, max_series_per_partition, ingestion_rate, ingestion_burst, unlimited, sample_rates.<kind>)"},
		{Target{Kind: TargetTenant, Tenant: "acme"}, Op{Kind: OpSet, Key: "sample_rates", Value: "1"}, "tenants.acme.sample_rates: set one kind at a time: sample_rates.<kind>=<percent>"},
		{Target{Kind: TargetTenant, Tenant: "acme"}, Op{Kind: OpUnset, Key: "unlimited"}, "tenants.acme.unlimited: unset max_series instead"},
		{Target{Kind: TargetTenant, Tenant: "acme"}, Op{Kind: OpSet, Key: "max_series", Value: "x"}, `tenants.acme.max_series: "x" is not an integer`},
		{Target{Kind: TargetTenant, Tenant: "acme"}, Op{Kind: OpSet, Key: "ingestion_rate", Value: "x"}, `tenants.acme.ingestion_rate: "x" is not a number`},
		{Target{Kind: TargetGlobal}, Op{Kind: OpSet, Key: "nope", Value: "1"}, "global.nope: unknown key (keys: sample_rates.<kind>, backlog_controller.<field>)"},
	} {
		if _, err := d.ApplyPatch(Patch{Target: c.target, Ops: []Op{c.op}}); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %s", c.op, err, c.want)
		}
	}
	if _, err := DecodeDocument(AppendDocument(nil, d)[:2]); err == nil || err.Error() != "runtimecfg: corrupt encoding: defaults max_series at offset 2: truncated" {
		t.Errorf("truncated after the defaults' mask: %v", err)
	}
}
