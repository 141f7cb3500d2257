// Package clockbound measures this node's clock against its peers' and
// decides whether it is in bound: whether this node may lead. Read this
// first.
//
// # Principle
//
// A node's clock is in bound only when confirmed against a majority of its
// groups' voters with fresh samples. The cluster tolerates node clocks up
// to the maximum clock offset (--max-clock-offset) apart. Every node
// measures its offset to each alive peer about once a second (Clock.Now
// over gRPC, corrected by half the round trip; of a short burst and of the
// last few samples, the one with the smallest round trip counts) and
// compares its own clock with the median of all measured clocks, its own
// included. It is confirmed when a majority of the groups' voters (itself
// included) have clocks within the bound of its own, each measured with a
// sample at most 10 s old taken since that peer last started (a boot id in
// Clock.Now's response header tells a restart), and it is within the bound
// of the median.
//
// A median alone is not enough: with two live clocks of three it is the
// one nearer this node's own, so each of two disagreeing nodes would find
// itself right. With a majority required, two clocks that disagree confirm
// neither (the group has no leader until one is fixed or the third node is
// back), and a node that just restarted leads nothing until a majority
// measured it and it measured them. Before any group configuration is
// known, the members serf knows (or --bootstrap-expect, if larger) are the
// voters, so a node of a cluster being formed never confirms itself alone.
//
// Only a confirmed node leads: an unconfirmed one asks for no votes and
// refuses leadership transfers (CampaignGate, raftnode's MayCampaign),
// runs no leader session, hands leadership it holds to a peer it measured
// within bound, and says why (OutOfBound: /readyz, status, metrics); it
// still serves as a follower. Each group's time comes from a
// groupclock.Clock (Group), fed by the entries the group applies and by
// this node's wall clock corrected by the median offset (Wall), so no
// single wrong clock moves a group's time by more than the bound. A group
// the node starts serving while it runs gets its clock from AddGroup, built
// as a boot group's, and counts in the voters and in enforce from then on.
//
// # Who owns what
//
//   - port.go: Node and Raft, all the clock reads from or does to the node
//     (the groups' rafts and voters, the members, the peer connection for
//     Clock.Now, the leader sessions). Package server implements it
//     (server/clockport.go) and wires the Clock; this package imports no
//     server.
//   - sample.go: the samples kept per peer, the median, the constants.
//   - clock.go: Clock, the group clocks (Group, AddGroup), the
//     majority-of-fresh-clocks rule (recomputeLocked) and what the node
//     asks of it on hot paths (Confirmed, GroupMinute, Wall).
//   - probe.go: the probe loop (Run), one probe, and enforce (leader
//     sessions stopped and leadership handed away while not confirmed).
//   - status.go: the Clock gRPC service (Now, Offsets) and Status, the
//     clock part of /api/v1/status.
//
// # Cost
//
// Per peer, one round (a burst of 3 Clock.Now calls) a second, every
// 250 ms while this node is not confirmed, on the node's pooled connection;
// 8 samples kept per peer. Confirmed, the clock is read with one atomic
// load on hot paths (every group-time stamp, raft's vote gate); the rule
// is recomputed once a probe round and, from the samples held, when raft's
// gate is asked while confirmed or a leader session is about to start.
package clockbound
