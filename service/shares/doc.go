// Package shares moves a tenant's unused max_series headroom between raft
// groups, on top of the replicated shares of fsm/shares.
//
// Who decides: the receiver, synchronously. When a group's leader rejects new
// series only because the group's share is used up (admission.TrackAtShare),
// Borrow asks the other groups' leaders in turn to Give; each giver takes its
// reservation with the decider paused (admission.Tracker.Exclusive), commits
// its reduction (give entry), and answers; the receiver commits the increase
// (receive entry) and tells the giver (Complete). The rejected series are then
// decided again. A background loop on each giver's leader re-drives
// transfers that stayed outstanding (a crash between the two commits, a lost
// Complete): it asks the receiver's leader to commit the receive (idempotent)
// and then commits the complete.
//
// Node is all of this on one node, built from its nodeport.Port: each
// group's module, the share functions admission decides with (Share,
// AdmitShare), Track (decide, borrow, decide again), the Mover's Host and
// the validated Shares calls. Package server adds the limits and usage it
// reads and the admin guard of the gRPC service.
package shares
