package api

import (
	"strings"
	"testing"
)

func TestValidateTenantID(t *testing.T) {
	good := []string{"a", "tenant-1", "Team_A.prod", "x*(y)'!", strings.Repeat("a", MaxTenantIDLength)}
	for _, id := range good {
		if err := ValidateTenantID(id); err != nil {
			t.Errorf("ValidateTenantID(%q) = %v, want nil", id, err)
		}
	}
	bad := []string{"", ".", "..", "a/b", "a b", "ü", "a\x00", strings.Repeat("a", MaxTenantIDLength+1)}
	for _, id := range bad {
		if err := ValidateTenantID(id); err == nil {
			t.Errorf("ValidateTenantID(%q) = nil, want error", id)
		}
	}
}
