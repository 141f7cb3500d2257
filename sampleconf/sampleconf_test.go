package sampleconf

import (
	"math"
	"strings"
	"testing"
)

func TestValidateKind(t *testing.T) {
	for _, ok := range []string{"locate", "submit", "a", "Locate_2", "x-y", "5xx", "_x", "-x", "a" + strings.Repeat("b", MaxKindLen-1)} {
		if err := ValidateKind(ok); err != nil {
			t.Errorf("ValidateKind(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a.b", "a=b", "é", "a" + strings.Repeat("b", MaxKindLen)} {
		if err := ValidateKind(bad); err == nil {
			t.Errorf("ValidateKind(%q) = nil, want an error", bad)
		}
	}
}

func TestValidatePercent(t *testing.T) {
	for _, ok := range []float64{0, 0.5, 50, 100} {
		if err := ValidatePercent(ok); err != nil {
			t.Errorf("ValidatePercent(%v) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []float64{-0.1, 100.01, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if err := ValidatePercent(bad); err == nil {
			t.Errorf("ValidatePercent(%v) = nil, want an error", bad)
		}
	}
}
