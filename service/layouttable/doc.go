// Package layouttable serves the partition → group table that group 0's FSM
// replicates (fsm/layouttable): which group decides a partition on this node
// (Owner, Route), the Moved answer for a request routed by another table,
// the table's wire form for the cluster view (View), and replacing the table
// through group 0's log (Propose).
//
// A node decides by its own replica of group 0: the arithmetic of (P, G)
// until a layout-set or layout-raise entry applies there. A node that holds
// no replica of group 0 (more nodes than a group has voters) learns the
// table from group 0's leader every second (Follow) and routes by the
// newer of the two (Current); a request routed by an older table is safe
// either way, as the giving group's fence answers Moved (service/partmove).
package layouttable
