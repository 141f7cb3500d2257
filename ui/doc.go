// Package ui is the web dashboard every node serves under /ui/: static HTML,
// CSS and plain JavaScript embedded in the binary (no framework, no CDN, no
// build step) that poll the node's JSON API (/api/v1/overview and
// /api/v1/tenants/{tenant}) once a second and render the cluster by zone, the
// raft groups, rates, and tenants against their limits.
package ui
