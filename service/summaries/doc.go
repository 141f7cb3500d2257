// Package summaries serves the near-limit summary stream (api.Summaries): it
// computes, from this node's own replicas, which tenants are near their limit in
// every group, and fans the changes out to subscribed clients.
//
// One Hub per node. Every Period (100 ms) it asks its Source, per group, for the
// replica's applied index and, when that index moved (or at least every
// Heartbeat, so limit reloads are seen), for the near-limit set; it diffs the set
// against the previous one and sends the changes to the subscribers of that
// group. Each subscriber has a bounded buffer: a subscriber that does not keep
// up is dropped (ResourceExhausted) instead of holding back the others; it
// reconnects and gets the full state again. With no subscribers the Hub
// computes nothing. A group the node starts serving while it runs joins with
// AddGroup: subscribers to every group get its full state, then its changes;
// one that listed its groups keeps getting those only.
//
// The package knows no raft, FSM or limits: the server supplies a Source.
package summaries
