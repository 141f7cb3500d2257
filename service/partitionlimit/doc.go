// Package partitionlimit is a Tollgate node's side of the per-partition HyperLogLog
// limits: it holds the merged (tenant, ingest partition, minute)
// sketches that clients push, forwards changes to peer nodes, and streams
// changes to subscribed clients.
//
// Merging is register-wise max, which is idempotent, commutative and
// associative, so the state needs no consensus and lives outside the raft
// FSM: a node that restarts starts empty and is refilled by its peers and by
// the clients' next pushes. Minutes that leave the window are dropped. The
// number of sketches a node holds is capped (ResourceExhausted beyond), and a
// sketch is kept sparse (index|value entries) until a quarter of its
// registers are set.
//
// Hub is the state; Service serves the api.Sketches gRPC service over it;
// RunPeers pushes changes to the other nodes; RunExpiry drops old minutes;
// NodeConfig is a node's settings and Handler its /api/v1/sketches (node.go).
// Package server only wires them.
package partitionlimit
