// Package observability holds no code: this directory ships the Grafana
// dashboard (tollgate-dashboard.json) and the Prometheus alert rules
// (alerts.yaml) for Tollgate, and its test checks them against Prometheus's
// own parsers and against the metrics a real node exports. The Prometheus
// module is imported by the test only, never by the tollgate binary.
package observability
