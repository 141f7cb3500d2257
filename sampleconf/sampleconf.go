package sampleconf

import (
	"errors"
	"fmt"
	"math"
)

// MaxKindLen and MaxKeyLen bound names so a config cannot blow up a client.
const (
	MaxKindLen = 64
	MaxKeyLen  = 256
)

// ValidateKind checks a kind name: 1 to 64 letters, digits, '_' or '-'. The
// same names work as YAML keys, in the set syntax sample_rates.<kind>=P and as
// Prometheus label values. It is the one kind rule: the replicated runtime
// config narrows it (runtimecfg.ValidateKind: lower case, at most 32 bytes),
// so every kind a config can name is one a sampler takes.
func ValidateKind(kind string) error {
	if kind == "" {
		return errors.New("kind is empty")
	}
	if len(kind) > MaxKindLen {
		return fmt.Errorf("kind %.20q… is %d bytes, longer than %d", kind, len(kind), MaxKindLen)
	}
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && !(c >= '0' && c <= '9') && c != '_' && c != '-' {
			return fmt.Errorf("kind %q: byte %q not allowed (letters, digits, '_', '-')", kind, c)
		}
	}
	return nil
}

// ValidatePercent checks one percentage: a finite number from 0 to 100.
func ValidatePercent(p float64) error {
	if math.IsNaN(p) || p < 0 || p > 100 {
		return fmt.Errorf("%v is not a percentage (a number from 0 to 100)", p)
	}
	return nil
}
