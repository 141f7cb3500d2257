// Package shares is the fsm.Module that replicates, in each raft group, the
// group's share of every tenant's tenant-wide max_series, and the transfers of
// headroom between groups (entry types 8–10, cluster version 3; 26–27, the
// wide give and receive that reach groups a raise added, cluster version 7).
//
// A share is never stored whole. Every group computes its base share from the
// tenant's current limit with an exact split (Split: the bases of all groups
// sum to the limit exactly) and the module stores only the group's net delta:
// headroom received minus headroom given. A transfer is two entries in two
// logs, giver first: a give entry in the giver's group lowers its delta and
// records the transfer as outstanding (seq = the give entry's raft index); a
// receive entry in the receiver's group raises its delta, idempotently (per
// giver group the highest seq received is kept, and a giver has at most one
// outstanding transfer per (tenant, receiver)); a complete entry in the giver's
// group forgets the outstanding transfer once the receiver has it. Between the
// give and the receive the amount is in transit: counted in no group, so the
// sum of shares is at most the limit at every instant.
//
// The module also holds the leader's outgoing reservations (headroom promised
// to a give entry that has not applied yet); they are local to the node, never
// replicated, and released when the give entry applies, exactly like the
// series reservations of fsm.Tenant.
package shares
