// Package partmove is the fsm.Module through which a group hands one
// partition to another while both keep deciding for everything else: the
// hand-off of docs/online-groups.md, whose pure core and simulation are in
// layout/handoff. It owns four entry types (cluster versions 7 and 8):
//
//   - partition-give (23), in the giver's log: at the entry's position it
//     takes every series of the partition out of the group (fsm.FSM.
//     TakePartition), lowers each tenant's share by its series taken (so
//     usage and share leave together), stops owning the partition, and
//     keeps the transfer in the outbox under the move's nonce. The payload
//     is computed when the entry applies, so it holds every series
//     acknowledged before it. A give whose nonce is already in the outbox,
//     or of a partition the group does not own, changes nothing.
//   - partition-receive (24), in the receiver's log: installs the
//     transfer's series and share and starts owning the partition, once per
//     nonce (a re-delivery changes nothing).
//   - partition-complete (25), in the giver's log: forgets the outbox copy,
//     once the receiver reported the nonce received.
//   - partition-give-metering (29, cluster version 8): a partition-give that
//     also takes the partition's metering (fsm/metering, move.go) into the
//     transfer; its receive installs it before the series, and refuses the
//     whole transfer (changing nothing) if the metering cannot go in.
//
// Which partitions the group owns is replicated state here (Owns): the
// group's leader answers Moved for a partition it does not own, whatever the
// layout table says, so nothing is decided for a partition between its give
// and its receive.
//
// Byte formats (every integer an fsm/wire uvarint in its minimal form unless
// noted):
//
//	partition-give payload:     nonce, partition, receiver group
//	partition-complete payload: nonce
//	partition-receive payload:  the transfer
//
//	transfer:
//	  uvarint  nonce
//	  uvarint  partition (< P)
//	  uvarint  giver group, uvarint receiver group
//	  uvarint  the giver's minute (fsm.FSM.Now) when it gave
//	  uvarint  tenant count T
//	  T ×      uvarint name length L, L bytes name,
//	           uvarint series count H (≥ 1),
//	           H × 8 bytes hash (little-endian, strictly rising),
//	           H × 1 byte minute (fsm.MinuteOf)
//	  (tenants strictly rising by name)
//	  [uvarint length M ≥ 1, M bytes: the metering transfer] (only from a
//	                                  partition-give-metering)
//
//	snapshot section "partition-moves", version 1 (written once the group
//	gave or received a partition; absent, the group owns its arithmetic
//	range):
//	  1 byte   section version (1)
//	  uvarint  partitions P
//	  uvarint  owned count K, K × uvarint partition (strictly rising)
//	  uvarint  outbox count O, O × (uvarint length, the transfer)
//	           (strictly rising by nonce)
//	  uvarint  received count R, R × uvarint nonce (strictly rising)
package partmove
