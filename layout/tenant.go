package layout

import (
	"errors"
	"fmt"
)

// MaxTenantIDLength is the longest accepted tenant id, in bytes (as in Mimir/Cortex).
const MaxTenantIDLength = 150

// ErrInvalidTenantID is wrapped by every ValidateTenantID failure.
var ErrInvalidTenantID = errors.New("invalid tenant id")

// ValidateTenantID accepts 1..150 bytes of ASCII letters, digits and the
// characters ! - _ . * ' ( ), except the ids "." and ".." — the same set
// Mimir/Cortex accept, so any tenant a distributor already admits is valid here.
// It lives here, beside the other pure rules, so the runtime configuration
// state (fsm/runtimecfg) validates tenant names without linking gRPC.
func ValidateTenantID(id string) error {
	switch {
	case len(id) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidTenantID)
	case len(id) > MaxTenantIDLength:
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidTenantID, len(id), MaxTenantIDLength)
	case id == "." || id == "..":
		return fmt.Errorf("%w: %q is reserved", ErrInvalidTenantID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') {
			continue
		}
		switch c {
		case '!', '-', '_', '.', '*', '\'', '(', ')':
			continue
		}
		return fmt.Errorf("%w: byte %d (%q) is not allowed; use letters, digits and !-_.*'()", ErrInvalidTenantID, i, c)
	}
	return nil
}
