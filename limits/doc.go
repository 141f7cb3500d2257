// Package limits is the vocabulary of per-tenant limits shared by every
// layer: the effective limits a tenant is held to, the keys a scope (the
// defaults, or one tenant) may set and their one spelling (Key*), the one
// inheritance rule that turns the server's base and the scopes into
// effective limits, and the one rule for a raft group's share of a
// tenant-wide max_series (GroupShare). It imports only the standard
// library, so the state machine, the server and the client library resolve
// limits with the same code.
package limits
