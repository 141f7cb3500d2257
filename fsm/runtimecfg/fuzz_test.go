package runtimecfg

import (
	"bytes"
	"testing"
)

// The decoders face bytes from the log and from snapshots: whatever they get,
// they must not panic, and what they accept must be canonical (re-encoding
// gives the same bytes) and valid.
func FuzzDecodeDocument(f *testing.F) {
	d, _, err := ParseYAML([]byte(sampleYAML))
	if err != nil {
		f.Fatal(err)
	}
	d.Version = 3
	f.Add(AppendDocument(nil, d))
	f.Add(AppendDocument(nil, &Document{}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDocument(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendDocument(nil, d), b) {
			t.Fatalf("accepted a non-canonical encoding %x", b)
		}
		if err := d.Clone().Validate(); err != nil {
			t.Fatalf("accepted an invalid document: %v", err)
		}
		if _, _, err := ParseYAML(RenderYAML(d)); err != nil {
			t.Fatalf("decoded document does not render to valid YAML: %v\n%s", err, RenderYAML(d))
		}
	})
}

func FuzzDecodePayloads(f *testing.F) {
	d, _, _ := ParseYAML([]byte(sampleYAML))
	f.Add(byte(TypeApply), AppendApply(nil, Apply{Expected: 1, NewVersion: 2, Doc: d}))
	f.Add(byte(TypePatch), AppendPatch(nil, Patch{HasExpected: true, Expected: 2, Target: Target{Kind: TargetTenant, Tenant: "acme"},
		Ops: []Op{{Kind: OpSet, Key: "max_series", Value: "5"}}}))
	f.Add(byte(TypeInstall), AppendInstall(nil, d))
	f.Fuzz(func(t *testing.T, typ byte, b []byte) {
		m := New(nil)
		switch typ % 3 {
		case 0:
			if a, err := DecodeApply(b); err == nil && !bytes.Equal(AppendApply(nil, a), b) {
				t.Fatalf("non-canonical apply %x", b)
			}
		case 1:
			p, err := DecodePatch(b)
			if err == nil {
				if !bytes.Equal(AppendPatch(nil, p), b) {
					t.Fatalf("non-canonical patch %x", b)
				}
				// Whatever the keys say, applying must not panic.
				_, _ = m.Current().ApplyPatch(p)
			}
		case 2:
			if d, err := DecodeDocument(b); err == nil && !bytes.Equal(AppendInstall(nil, d), b) {
				t.Fatalf("non-canonical install %x", b)
			}
		}
	})
}
