package runtimecfg

import (
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/sampleconf"
)

// TestKindRule: the config's kind rule is exactly [a-z0-9_-]{1,32} (what
// replicas of every version apply, so entries validate the same everywhere),
// and every kind it accepts a sampler accepts too (a config once could name
// a kind, such as "5xx", that every sampler refused).
func TestKindRule(t *testing.T) {
	chars := "az09_-AZ. é=/"
	want := func(k string) bool {
		if len(k) < 1 || len(k) > MaxKindLength {
			return false
		}
		for i := 0; i < len(k); i++ {
			c := k[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	var kinds []string
	for _, a := range chars {
		kinds = append(kinds, string(a))
		for _, b := range chars {
			kinds = append(kinds, string(a)+string(b), "x"+string(a)+string(b))
		}
	}
	kinds = append(kinds, "", strings.Repeat("a", MaxKindLength), strings.Repeat("a", MaxKindLength+1), "5xx", "locate")
	for _, k := range kinds {
		ok := ValidateKind(k) == nil
		if ok != want(k) {
			t.Errorf("ValidateKind(%q) accepts=%v, want %v", k, ok, want(k))
		}
		if ok && sampleconf.ValidateKind(k) != nil {
			t.Errorf("kind %q: the config accepts it, samplers refuse it: %v", k, sampleconf.ValidateKind(k))
		}
	}
}
