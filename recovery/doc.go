// Package recovery rewrites, offline, the raft state of the groups a node
// holds after an outage that cost them their quorum (tollgate raft recover;
// the per-group plan is cluster.PlanGroupRecovery). A group whose voters are
// gone for good (disks lost, more than a quorum of them) can never elect a
// leader again, and nothing online can change its configuration, because
// that needs the quorum it lost. The survivors' data is still there: Prepare
// reads a stopped node's data dir and plans, per group, the configuration it
// has and the one recovery gives it (the survivors alone); Plan.Apply writes
// it with hashicorp/raft's RecoverCluster. Started again, the node elects
// itself and new nodes are added as usual.
//
// The plan holds the data dir's lock (package datadir) until Close, so no
// node starts on it meanwhile. FSM builds a group's state machine with the
// modules a running node gives it, so the snapshot recovery writes replays
// into the state the node builds.
package recovery
