// Package ui is the web dashboard every node serves under /ui/: static HTML,
// CSS and plain JavaScript embedded in the binary (no framework, no CDN, no
// build step) that poll the node's JSON API (/api/v1/overview and
// /api/v1/tenants/{tenant}) once a second and render the cluster by zone, the
// raft groups, rates, and tenants against their limits. OverviewHandler
// serves /api/v1/overview from what the node reads for it (its cluster view,
// groups and tenants) and keeps the rate samples itself.
package ui
