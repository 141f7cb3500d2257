// Package forward owns how one node passes a caller's call on to another
// node (the group leader, or a replica that holds the data): the metadata
// header that marks a call as forwarded, so it is forwarded at most once and
// a stale view cannot bounce it between nodes, and the caller's verified
// principal that travels with it (never the caller's token), so the node
// that answers applies the caller's rights and never the forwarding node's.
//
// It is the one definition of both; the server's admin, config and tracking
// forwarding and the metering service use it alike.
package forward
