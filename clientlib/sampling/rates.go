package sampling

import (
	"errors"
	"fmt"
	"sort"

	"github.com/tollgate-io/tollgate/sampleconf"
)

// Rates is one snapshot of sample rates, as the runtime config pushes it. All
// percentages are 0..100; a missing entry means 100.
type Rates struct {
	// Version orders snapshots: Update refuses one older than the snapshot in
	// force. 0 is the built-in "everything 100%" snapshot, so pushes start at 1.
	Version uint64
	// Global is the global percentage per kind (Ichnaea's
	// global_locate_sample_rate, for any kind). It multiplies every key's rate.
	Global map[string]float64
	// Default is the percentage per kind for keys without their own value for
	// the kind (the config's defaults.sample_rates).
	Default map[string]float64
	// Keys is the percentage per kind for each key (tenant or API key), like
	// Ichnaea's store_sample_locate / store_sample_submit.
	Keys map[string]map[string]float64
}

// ErrStaleVersion is returned by Update for a snapshot older than the one in
// force (or of the same version with different rates).
var ErrStaleVersion = errors.New("sampling: stale rates version")

// MaxKindLen and MaxKeyLen bound names so a config cannot blow up a client
// (sampleconf holds them, shared with the server-side controller).
const (
	MaxKindLen = sampleconf.MaxKindLen
	MaxKeyLen  = sampleconf.MaxKeyLen
)

// ValidateKind checks a kind name: a letter, then up to 63 letters, digits,
// '_' or '-' (sampleconf.ValidateKind, the rule the backlog controller uses too).
func ValidateKind(kind string) error { return sampleconf.ValidateKind(kind) }

// ValidatePercent checks one percentage: a finite number from 0 to 100.
func ValidatePercent(p float64) error { return sampleconf.ValidatePercent(p) }

// Validate checks every name and percentage and names the first bad field, in
// a stable order (global, default, then keys sorted), so the same bad snapshot
// always gives the same error.
func (r Rates) Validate() error {
	if r.Version == 0 {
		return errors.New("sampling: version 0 is reserved for the built-in all-100% rates; versions start at 1")
	}
	if err := validateKindMap("global", r.Global); err != nil {
		return err
	}
	if err := validateKindMap("default", r.Default); err != nil {
		return err
	}
	for _, key := range sortedKeys(r.Keys) {
		if key == "" || len(key) > MaxKeyLen {
			return fmt.Errorf("sampling: keys[%.40q]: a key must be 1 to %d bytes", key, MaxKeyLen)
		}
		if err := validateKindMap(fmt.Sprintf("keys[%q]", key), r.Keys[key]); err != nil {
			return err
		}
	}
	return nil
}

func validateKindMap(where string, m map[string]float64) error {
	for _, kind := range sortedKeys(m) {
		if err := ValidateKind(kind); err != nil {
			return fmt.Errorf("sampling: %s: %w", where, err)
		}
		if err := ValidatePercent(m[kind]); err != nil {
			return fmt.Errorf("sampling: %s.%s = %w", where, kind, err)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// clone deep-copies r so the caller may keep mutating its maps.
func (r Rates) clone() Rates {
	out := Rates{Version: r.Version, Global: cloneKinds(r.Global), Default: cloneKinds(r.Default)}
	if r.Keys != nil {
		out.Keys = make(map[string]map[string]float64, len(r.Keys))
		for k, m := range r.Keys {
			out.Keys[k] = cloneKinds(m)
		}
	}
	return out
}

func cloneKinds(m map[string]float64) map[string]float64 {
	if m == nil {
		return nil
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// equal reports whether two snapshots give every (key, kind) the same rate
// (nil and empty maps are the same).
func (r Rates) equal(o Rates) bool {
	if r.Version != o.Version || !kindsEqual(r.Global, o.Global) || !kindsEqual(r.Default, o.Default) || len(r.Keys) != len(o.Keys) {
		return false
	}
	for k, m := range r.Keys {
		om, ok := o.Keys[k]
		if !ok || !kindsEqual(m, om) {
			return false
		}
	}
	return true
}

func kindsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
