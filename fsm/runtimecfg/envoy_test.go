package runtimecfg

import (
	"errors"
	"strings"
	"testing"
)

const envoyDoc = `
tenants:
  acme:
    ingestion_rate: 5
envoy:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: tier
        value: free
        descriptors:
          - key: user
            shadow_mode: true
            rate_limit: {name: free_user, unit: minute, requests_per_unit: 5}
  - domain: api
    descriptors:
      - key: path
        value: /health
        rate_limit: {unlimited: true}
`

func TestEnvoySectionRoundTrips(t *testing.T) {
	d, _, err := ParseYAML([]byte(envoyDoc))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.EnvoyDomains(); len(got) != 2 || got[0] != "api" || got[1] != "edge" {
		t.Fatalf("domains %v", got)
	}
	// YAML: render → parse → same content and same bytes.
	y := RenderYAML(d)
	d2, _, err := ParseYAML(y)
	if err != nil {
		t.Fatalf("rendered YAML does not parse: %v\n%s", err, y)
	}
	if !SameContent(d, d2) || string(RenderYAML(d2)) != string(y) {
		t.Fatalf("YAML round trip changed the document:\n%s", y)
	}
	// Binary: the snapshot form decodes to the same content.
	d.Version = 9
	b := AppendDocument(nil, d)
	d3, err := DecodeDocument(b)
	if err != nil || !SameContent(d, d3) || d3.Version != 9 {
		t.Fatalf("decode: %v", err)
	}
	// The entry types follow the content.
	if ApplyType(d) != TypeApplyEnvoy || InstallType(d) != TypeInstallEnvoy {
		t.Fatal("a document with an Envoy section must travel in the envoy entry types")
	}
	plain := d.Clone()
	plain.Envoy = nil
	if ApplyType(plain) != TypeApply || InstallType(plain) != TypeInstall {
		t.Fatal("a document without an Envoy section must keep the version-3 types")
	}
	// Without an Envoy section the encoding is what it was before.
	if !strings.HasPrefix(string(b), string(AppendDocument(nil, &Document{Version: 9, Tenants: d.Tenants}))) {
		t.Fatal("the Envoy section is not a pure suffix")
	}
	// A change of one limit is a change of content, and shows in Flatten.
	d4, _, err := ParseYAML([]byte(strings.Replace(envoyDoc, "requests_per_unit: 10", "requests_per_unit: 11", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if SameContent(d, d4) {
		t.Fatal("a changed Envoy limit is the same content")
	}
	found := false
	for _, kv := range Flatten(d4) {
		if kv.Key == "envoy.edge.remote_address" && kv.Value == "11/second" {
			found = true
		}
	}
	if !found {
		t.Fatalf("Flatten does not list the Envoy rule: %v", Flatten(d4))
	}
}

func TestEnvoySectionErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"envoy:\n  - domain: a\n  - domain: a\n", "envoy[1].domain"},
		{"envoy:\n  - domain: a\n    descriptors:\n      - key: k\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "envoy[0].descriptors[0].rate_limit.unit"},
		{"envoy: {domain: a}\n", "envoy"},
	} {
		_, _, err := ParseYAML([]byte(tc.yaml))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want+":") {
			t.Errorf("ParseYAML(%q) = %v, want an error naming %s", tc.yaml, err, tc.want)
		}
	}
	// Non-canonical or corrupt Envoy bytes are refused as corrupt.
	d, _, _ := ParseYAML([]byte(envoyDoc))
	b := AppendDocument(nil, d)
	for _, bad := range [][]byte{append(b[:len(b):len(b)], 0), b[:len(b)-3]} {
		if _, err := DecodeDocument(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decode of damaged bytes: %v", err)
		}
	}
}
