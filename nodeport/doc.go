// Package nodeport is "this node" as a replicated capability sees it: one
// port every capability (metering, runtime config, movable shares, the
// admin API) is written against, so that what leading a group means, how an
// entry is proposed and how a call reaches a group's leader are defined once.
//
// The server implements Port; a capability's own host interface embeds it
// and adds only what is the capability's (its FSM module, its inputs). Pool
// is the node's one set of connections to its peers, and Pool.Leader the one
// way a call is passed to a group's leader: at most once (package forward
// marks it), carrying the caller's credential, or the node's own when the
// node calls for itself.
package nodeport
