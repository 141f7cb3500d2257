// Package tenantscope carries the tenants a caller's credential may act on
// in a request's context, from the node's access check to the handler that
// parses the request.
//
// The access check sees a request before it is parsed; only the handler
// knows, after its own parse, which tenants a request touches (the
// organization ids of a metering batch, the names a rate-limit stream
// introduces). The check therefore authenticates the caller and attaches
// its scope here; the handler asks Check about exactly the tenants it is
// about to act on, before anything is written. One parse, one decision: no
// second parser in the guard that could read a body differently.
package tenantscope
