// Package handoff is the partition hand-off protocol by which a cluster would
// raise its group count online: a partition range leaves its group (the
// source) and is adopted by another (the destination, e.g. a group just
// created), under load, with every acknowledged series kept, the tenant's
// limit never exceeded and exactly one group deciding for a partition at any
// time. It holds the protocol's pure core — the replicated state a group
// keeps for it, the entries that change that state, the leader's decision
// for a tracking request and the coordinator's next step — with no I/O, in
// the style of package admission; the simulation test drives it through
// crashes, lost and duplicated messages and stale routing, and catches each of
// four deliberately broken variants. It is not wired into the server yet: the
// design, its costs and what wiring it takes are in docs/online-groups.md.
//
// The protocol, for one move of partition p from group S to group D:
//
//  1. Give (an entry in S's log, nonce n): applied, it removes p's series
//     from S, lowers each tenant's usage and share in S by the tenant's
//     series in p, and keeps the transfer (those series and that share) in
//     S's outbox under n. The payload is computed by S's state machine at
//     the entry's index, so it holds every series acknowledged before it;
//     from the moment S's leader appends Give, it decides nothing more for p
//     (Moved), so no decision can be ordered after it.
//  2. Receive (an entry in D's log, the transfer from S's outbox): applied
//     once per nonce, it installs the series and adds the usage and share.
//     The coordinator re-delivers it until D reports n as received.
//  3. Route: the layout (which group owns which partition, with an epoch)
//     names D for p. Clients routing by an older layout get Moved and
//     refresh.
//  4. Complete (an entry in S's log): drops n from S's outbox, only after D
//     reported n, so a restarted coordinator can always re-deliver.
//
// Between Give and Receive no group decides for p: its requests get a
// retryable answer for the time one entry takes to commit in D.
package handoff
