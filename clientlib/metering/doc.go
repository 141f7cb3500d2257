// Package metering is the Go client of Tollgate's continuous-usage metering:
// start and stop events over gRPC, ledger queries. It depends only
// on package api. Any node accepts an event (it forwards to the leader of the
// target's group); Unavailable means retry, and retrying with the same event
// id is always safe (an exact duplicate is accepted as such).
package metering
