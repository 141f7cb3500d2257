// Package layouttable is the fsm.Module that replicates the partition → group
// table (layout.Table) in group 0, beside the runtime configuration: two
// entry types, layout-set (type 21, cluster version 5), which replaces the
// table by compare-and-set on its epoch, and layout-raise (type 22, cluster
// version 6, raise.go), which raises the group count with the same owners
// and names the new groups' voters; and one snapshot section, "layout".
//
// Until a table applies, the module holds no table and answers
// the arithmetic of the cluster's (P, G) (layout.ArithmeticTable, epoch 0):
// an upgraded cluster routes exactly as before and writes byte-identical
// snapshots (no section) until a move is planned. The byte formats are
// documented beside their code (codec.go).
//
// The table is routing, not ownership: moving a partition's series, usage
// and share from one group to another is the hand-off protocol of
// docs/online-groups.md (layout/handoff), which is separate work. A table
// that moves a partition holding series moves only where it is decided.
package layouttable
