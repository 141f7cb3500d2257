// Package envoyrls is Envoy's rate limit service on a Tollgate node
// (envoy.service.ratelimit.v3.RateLimitService): each request descriptor
// that matches a rule of the replicated Envoy configuration (package
// envoyrl) is a rate key decided against the node's lease from the key's
// owner (package ratelease), with no raft entry and no call on the request
// path. Rules gives the owner side the limit of a key from the owning
// group's replica. Package server only wires them.
package envoyrls
