// Package clientlib is the Go client distributors embed to ask Tollgate whether
// series may be written.
//
// It depends only on package api: it splits hashes by partition with
// api.Partition, sends one TrackSeries per partition in parallel, and follows
// NotLeader redirects (the FailedPrecondition status carries the leader's gRPC
// address). This first version talks to a fixed set of nodes; the cluster-aware
// client (leader table from a watch stream, sync/async tracking, fail-open) builds
// on it.
//
//	c, err := clientlib.New(clientlib.Config{Addrs: []string{"127.0.0.1:7300"}})
//	if err != nil { ... }
//	defer c.Close()
//	rejected, err := c.TrackSeries(ctx, "tenant-a", hashes)
package clientlib
