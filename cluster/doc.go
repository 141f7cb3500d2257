// Package cluster is cluster control: who is a voter of which raft group,
// who leads it, and how that changes as nodes join, leave, are drained or
// come back with a new disk.
//
// # Principle
//
// Decisions are pure; execution goes through a port. The planners (plan.go,
// placement.go, planIncarnation) take a snapshot of what a node knows —
// members with zones and status, groups' raft configurations, which groups
// it leads — and return actions; they do no I/O and read no clock, so table
// tests cover every case. The Controller gathers the snapshot and executes
// the actions through Node and Raft (port.go), the only way it reaches the
// node: package server implements the port over its raft host, serf and
// peer pool (server/clusterport.go); the tests here implement it over a fake
// raft. The package imports no server.
//
// # Owner
//
// Every node runs one Controller. It acts only for the groups raft makes it
// leader of (one configuration change at a time per group, as raft
// requires), except bootstrap, which every node of a new cluster runs for the
// groups it is a voter of. Server's cluster loop calls Place and
// BalanceLeaders every tick; RunIncarnations runs beside it; the admin API
// calls AddLearner, RemovalKeepsQuorum and IncarnationAddr.
//
// # Behaviours
//
//   - Bootstrap (controller.go, planBootstrap): once --bootstrap-expect
//     members are alive, every one of them computes the same configuration
//     per group and bootstraps the groups it is a voter of; the cluster id
//     (identity.go) keeps a wiped or new node from bootstrapping a second
//     cluster beside an existing one.
//   - Reconcile (planReconcile): when a member becomes alive, a leader tops
//     its group up to one voter per zone and Replicas voters, towards
//     PlaceAll's placement; it never removes a server.
//   - Learners (learner.go): every addition — the operator's add-voter,
//     reconcile's, a move's — enters as a non-voter and is promoted only once
//     its own replica reports a log within LearnerMaxLag of the leader's;
//     one that does not catch up is removed again. A learner a previous
//     leader left is finished by the next (resumeLearners).
//   - Leader balancing and hand-off (PlanBalance, MoveLeader,
//     HandOffLeadership): one transfer at a time towards leader counts
//     within one of each other; a stopping node hands every group away.
//   - Replica moves and decommission (move.go, planMoves): one move at a
//     time per leader towards PlaceAll, learner first, old voter removed
//     after; a drained node's replicas move away; the status compares each
//     group with placement (PlacementStatus).
//   - Incarnation replacement (incarnation.go): a node whose data dir was
//     replaced comes back as a new incarnation; the leader removes the
//     earlier one only while the voters left include an up-to-date quorum,
//     adds the new one as a non-voter and promotes it once caught up.
//   - The quorum check before a removal (quorum.go): an operator's
//     remove-server that would leave fewer running voters than a quorum is
//     refused.
//   - Rolling upgrades (versions.go, VersionLag): which servers of a group
//     can apply an entry of a cluster version.
//   - Offline recovery (recover.go, PlanGroupRecovery): the configuration a
//     group that lost its quorum for good gets on a stopped survivor.
package cluster
