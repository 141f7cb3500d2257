// Package membership runs a node's serf agent: who is in the cluster, in which
// zone, at which gRPC and raft addresses, and which raft groups each member
// leads.
//
// It knows nothing about raft or tracking; the server reads Members and feeds
// SetLed. What each member gossips is a handful of short serf tags (serf caps a
// member's tags at 512 bytes, so large summaries travel over gRPC instead):
//
//	z   zone                     "zone-a"
//	g   gRPC address             "10.0.0.5:7300"
//	r   raft address             "10.0.0.5:7301"
//	l   groups led, as ranges    "0-3,7,9-10"   (empty: none)
//	ver cluster version          "3"            (highest the build supports)
//	disk "full" while the disk refuses raft writes (absent otherwise)
//
// Members that fail or leave stay listed, with the tags they last gossiped,
// until serf reaps them (24 h): the server's version gate relies on that.
//
// With G = 4096 groups all led by one node the "l" tag is "0-4095": ranges keep
// it short in the common case; SetLed refuses a set whose encoding would exceed
// the tag budget rather than letting serf drop the update.
//
// The gossip port's TCP side (push-pull state sync, TCP probes) runs through
// a transport around memberlist's own (streamcap.go) that caps the inbound
// streams open at once, a quarter per IP address: a stranger's idle
// connections cannot make memberlist hold a goroutine and a reader for each.
package membership
