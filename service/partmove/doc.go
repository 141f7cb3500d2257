// Package partmove serves the partition hand-off (docs/online-groups.md):
// the PartitionMoves gRPC service a group's leader answers (give, receive,
// complete, state), the fence its leader path asks before deciding a request
// (admission.Config.Fence: Moved for a partition leaving or gone), and the
// coordinator that runs on group 0's leader and moves every partition whose
// owner differs from the raised layout's target, one at a time, each step
// chosen by layout/handoff.Next from the groups' replicated state alone. The
// state it reads and changes is fsm/partmove's, in each group's FSM.
package partmove
