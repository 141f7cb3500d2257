package api

import "github.com/tollgate-io/tollgate/layout"

// MaxTenantIDLength is the longest accepted tenant id, in bytes (as in Mimir/Cortex).
const MaxTenantIDLength = layout.MaxTenantIDLength

// ErrInvalidTenantID is wrapped by every ValidateTenantID failure.
var ErrInvalidTenantID = layout.ErrInvalidTenantID

// ValidateTenantID accepts 1..150 bytes of ASCII letters, digits and the
// characters ! - _ . * ' ( ), except the ids "." and ".." (see
// layout.ValidateTenantID, where the rule lives so the FSM can use it).
func ValidateTenantID(id string) error { return layout.ValidateTenantID(id) }
