// Package gateway is Tollgate's remote-write gateway: a stateless HTTP
// handler that sits between Prometheus-compatible writers (Prometheus,
// Grafana Agent/Alloy, the OpenTelemetry Collector) and any remote-write
// backend (Mimir, Cortex, Thanos Receive, VictoriaMetrics, Prometheus), and
// applies a tenant's Tollgate limits to every request without a change on
// either side.
//
// Per request (POST /api/v1/push or /api/v1/write):
//
//  1. The tenant comes from the tenant header (X-Scope-OrgID by default), else
//     Config.DefaultTenant; without either the request is refused (401).
//  2. The body is bounded (Config.MaxRequestBytes compressed, 413 before it
//     is read when Content-Length says so), snappy-decoded after checking the
//     size its header announces (Config.MaxDecompressedBytes, 413), and
//     decoded as the message Content-Type names (remote write 1.0
//     prometheus.WriteRequest, or 2.0 io.prometheus.write.v2.Request; 415
//     for anything else). Labels are checked (names non-empty, unique and
//     sorted; names and values valid UTF-8): a bad body or a bad series
//     refuses the whole request with 400 naming the problem, and nothing is
//     forwarded.
//  3. A series' id is labels.Labels.Hash of its label set, the hash
//     Prometheus itself uses, so a series has one id in Tollgate and in the
//     backend.
//  4. Samples (float and histogram) are charged to the tenant's ingestion rate
//     through Config.Rate (clientlib/ratelimit leases: a local decision, no
//     network call): over it, 429 with Retry-After and nothing forwarded.
//     With Config.PartitionLimit (a partitioned upstream), the ids are checked
//     per partition against max_series_per_partition (clientlib/partitionlimit,
//     local): a partition over it refuses the whole request (429).
//  5. The distinct ids go to Tollgate in one TrackSeries call (clientlib: one
//     RPC per partition, all in parallel, each to its group's leader, which
//     batches them into its next raft entry). Rejected series are removed and
//     the rest is forwarded; when nothing is removed the original body is
//     forwarded unchanged.
//  6. The answer follows the remote-write specification and Mimir: 2xx when
//     everything was forwarded; 400 naming the tenant, the limit and the
//     counts when series were over the limit (the accepted part was
//     forwarded, and a 400 is not retried); the upstream's 4xx as it is; its
//     5xx, a timeout (504) or an unreachable upstream (502) as 5xx so the
//     sender retries. A retry is safe: an accepted series stays accepted
//     while it is active, so a retried request loses nothing it had.
//
// When Tollgate cannot answer (clientlib.IsFailOpenable), a tenant that fails
// open (Config.FailOpen, Config.FailOpenTenants) has the undecided series
// forwarded; one that fails closed gets 503 and the sender retries.
//
// Requests in flight are bounded by Config.MaxInflight (503 with Retry-After
// beyond). /readyz fails while Tollgate has no leader for some group, while
// the upstream does not answer (Config.UpstreamReadyURL, else a TCP connect)
// and once BeginShutdown was called; the HTTP server's Shutdown then drains
// the requests in flight.
//
// Metrics: tollgate_gateway_requests_total{code},
// tollgate_gateway_series_total and tollgate_gateway_samples_total
// {tenant,decision,reason}, tollgate_gateway_invalid_requests_total{tenant},
// tollgate_gateway_forwarded_samples_total{tenant},
// tollgate_gateway_fail_open_total{tenant,decision},
// tollgate_gateway_upstream_duration_seconds{code},
// tollgate_gateway_request_duration_seconds,
// tollgate_gateway_own_duration_seconds (the request's time minus the
// upstream's: what the gateway adds),
// tollgate_gateway_track_duration_seconds, tollgate_gateway_inflight_requests
// and tollgate_gateway_ready.
//
// The gateway is a Tollgate client: it imports clientlib, and no server-side
// package imports it. `tollgate gateway` runs it (cmd/tollgate/gateway.go).
package gateway
