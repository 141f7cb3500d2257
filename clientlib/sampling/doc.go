// Package sampling decides, locally and without a network call, whether one
// unit of traffic of a given kind from a given key (tenant or API key) is kept
// ("sampled") or dropped, from a snapshot of sample rates the replicated runtime
// config pushes to clients.
//
// The effective rate of (key, kind) is the key's percentage for the kind times
// the global percentage for the kind, as in Ichnaea (its per-API-key
// store_sample_* and global_locate_sample_rate): key 60% × global 50% = 30%.
// Kinds are free strings (Ichnaea has "locate" and "submit"); a key without its
// own value for a kind takes the snapshot's default for the kind, and a kind or
// a global value nobody configured is 100%.
//
//	s := sampling.New(sampling.Options{})
//	err := s.Update(sampling.Rates{Version: 7,
//		Global: map[string]float64{"locate": 50},
//		Keys:   map[string]map[string]float64{"tenant-a": {"locate": 60}}})
//	if s.ShouldSample("tenant-a", "locate") { ... } // true 30% of the time
//
// # Deterministic decisions
//
// ShouldSampleItem derives the decision from a caller-supplied item hash
// instead of a random number, so every client (and every retry) keeps or drops
// the same item the same way. The hash goes through a fixed 64-bit mixer before
// it is compared with the rate's threshold, so sequential ids or hashes that
// were already used for partitioning still sample at the configured rate. The
// decision is monotonic in the rate: an item kept at p% is kept at any rate
// ≥ p%, so lowering a rate drops a subset of what was kept, never a different set.
//
// # Hot path
//
// Update validates a Rates value, compiles it into an immutable table of
// integer thresholds and swaps it in with one atomic pointer store; a snapshot
// with a lower version than the one in force is refused (ErrStaleVersion), so
// a late or replayed push cannot roll the rates back. ShouldSample* read the
// table with one atomic load, one map lookup (the key) and a scan of the few
// configured kinds, take no lock, allocate nothing, and bump one striped
// atomic counter per decision for Stats.
//
// Package sampling depends only on the standard library; package sampleprom
// exports its Stats as Prometheus metrics for programs that want them.
package sampling
