// Package runtimecfg is the replicated runtime configuration: per-tenant
// limits (max_series, max_series_per_partition, ingestion_rate,
// ingestion_burst, sample_rates) with defaults, global settings (global sample
// rates per traffic kind, the backlog controller block) and a version that
// increases with every change. It is an fsm.Module: the document lives in raft,
// changes are log entries (apply a whole document with compare-and-set, patch
// keys of one scope, install a copy made elsewhere), and it writes one section
// of the group's snapshot.
//
// The package owns the document's schema, its validation (errors name the
// field, as in "tenants.acme.ingestion_rate: -1 must be ≥ 0"), its canonical
// byte form (format.md) and its YAML form (the limits file and the CLI). It
// knows nothing of gRPC or of which group orders changes: that is the serving
// side (package service/runtimecfg) and the server's wiring.
package runtimecfg
