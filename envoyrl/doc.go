// Package envoyrl reads rate-limit configuration in the format of Envoy's
// reference rate limit service (envoyproxy/ratelimit): a domain with nested
// descriptors, each with a key, an optional value, an optional rate_limit
// (unit, requests_per_unit, unlimited, name, replaces), shadow_mode and
// detailed_metric. It validates a file naming the field on error, renders a
// canonical form (one byte string per meaning, so the replicated runtime
// config can carry it), and matches request descriptors to rules the way that
// format defines: same depth, key and value before key alone. It does no I/O
// and knows nothing of the wire protocol or of how limits are enforced.
package envoyrl
