package runtimecfg

import (
	"bytes"
	"encoding/hex"
	"testing"
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
