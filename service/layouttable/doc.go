// Package layouttable serves the partition → group table that group 0's FSM
// replicates (fsm/layouttable): which group decides a partition on this node
// (Owner, Route), the Moved answer for a request routed by another table,
// the table's wire form for the cluster view (View), and replacing the table
// through group 0's log (Propose).
//
// A node decides by its own replica of group 0: the arithmetic of (P, G)
// until a layout-set entry applies there. A node that holds no replica of
// group 0 keeps the arithmetic; giving it the table, and making a move safe
// for a partition that holds series, is the hand-off work of
// docs/online-groups.md.
package layouttable
