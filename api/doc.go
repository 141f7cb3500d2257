// Package api is Tollgate's wire contract: the protobuf/gRPC definitions (generated
// code committed beside tracker.proto) and the few pure functions that server and
// clients must compute identically — which partition a series hash falls into,
// which group owns a partition, and what a valid tenant id is.
//
// clientlib depends on this package only; so does any other client.
package api
