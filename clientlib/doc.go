// Package clientlib is the Go client distributors embed to ask Tollgate, before
// writing, whether a tenant's series may go in.
//
// It depends only on the standard library, gRPC, protobuf and package api.
//
//	c, err := clientlib.New(clientlib.Config{Addrs: []string{"10.0.0.1:7300", "10.0.0.2:7300"}})
//	if err != nil { ... }
//	defer c.Close()
//	rejected, err := c.TrackSeries(ctx, "tenant-a", hashes)
//
// # Routing
//
// Series hashes fall into P partitions (api.Partition) and partitions into G
// raft groups by the layout table (the arithmetic api.GroupOf until the
// cluster view carries a table, ClusterView.layout; the client keeps the
// newest epoch it has seen); each group is decided by its leader. TrackSeries
// splits the hashes by partition and sends one TrackSeries RPC per non-empty
// partition, in parallel, to the leader of the partition's group, naming the
// group. A Moved answer (the partition went to another group) sends the
// request on to the owner it names, within the retry budget and never as an
// error (Stats.Moved).
//
// The client learns leaders from a WatchCluster stream it keeps open to one
// node (seeds from Config.Addrs, then every member the cluster view lists, in
// turn, with backoff on failure): each ClusterView replaces the group → leader
// table and the member list. The first view also gives the layout when
// Config.Partitions/Groups are 0, and is checked against them otherwise (a
// mismatch fails every call with a *LayoutError). A NotLeader answer
// (FailedPrecondition with an api.NotLeader detail, see LeaderHint) updates the
// table too, and the request follows the hint at once. A group without a known
// leader is asked of any known node, which redirects. Against servers that do
// not implement WatchCluster (Unimplemented) the client routes by hints alone,
// logs that once, assumes api.DefaultPartitions/DefaultGroups for a layout left
// at 0, and asks again for a stream every 30s.
//
// # Retries and deadlines
//
// NotLeader, Unavailable (no leader yet, node stopping, connection errors) and
// Aborted are retried, and so is DeadlineExceeded while the caller's own
// deadline has not passed; other errors (InvalidArgument, ResourceExhausted…)
// are returned at once. Waits between attempts grow exponentially from
// Config.RetryInitial to Config.RetryMax with jitter, and a wait that would end
// past the caller's deadline is not started. Each partition retries on its
// own; a new leader learned from an answer (a NotLeader hint, or the leader
// table updated by the cluster watch or another partition of the group) is
// progress and starts the backoff again from RetryInitial, so calls that span
// every group stay short while leaderships move often. A retry waiting out its
// backoff goes at once when its group's new leader becomes known (after a
// failover the cluster watch names it; Stats.LeaderWakes), so the backoff
// grown during an election does not delay the first request after it. Calls without a deadline get
// Config.Timeout. Re-sending is always safe: tracking is idempotent, and a
// series that was accepted is never rejected while it stays active.
//
// # Sync and async tracking
//
// In ModeAuto (the default) the client keeps the set of (group, tenant) near
// their limit from WatchSummaries streams (api/summaries.proto): each group is
// watched on a node that does not lead it (its leader only when no follower is
// usable), which pushes the group's full set on subscribe and every change
// after, tagged with the replica's applied index; a summary older than one the
// client already holds is ignored. Against servers without that service
// (Unimplemented) the client polls GetUsersCloseToLimit every
// Config.NearLimitRefresh instead, logging the fallback once and trying the
// stream again later. An answer with rejections adds its (group, tenant) until
// the next summary. Partitions of a group where the tenant is near its limit —
// or where the client has no fresh list (before the first summary, or when no
// node has served the group for a while) — are sync: the
// call waits for their answer. The other partitions are async: the call waits
// at most Config.AsyncWait for them and then returns without their rejections
// and without error, while the request keeps running in the background for at
// most Config.AsyncTimeout; answers that come late are counted in Stats. Only
// the sync parts can fail the call: an async part's failure is dropped (and
// counted in Stats.AsyncLateErrors), even when the call was still waiting for
// a slow sync part when it came, unless it came within AsyncWait and is a
// refusal every part would meet (not IsFailOpenable: a bad token or
// argument); it is never a fail-open decision. An async part that answered
// while the call was still waiting adds its rejections. A
// tenant far from its limit almost never has series rejected, so async trades
// a rare, bounded overshoot for latency. ModeSync waits for everything.
// TrackPartition always waits.
//
// # Failures
//
// With Config.FailOpen, a partition whose request finally fails because
// Tollgate could not answer (IsFailOpenable) contributes no rejections and no
// error, and is counted in Stats.FailedOpen. Otherwise the call returns a
// *PartitionError (or a *TrackError for several partitions) naming the group
// and partition and wrapping the gRPC error: status.Code(err) and
// status.FromError(err) give its code.
package clientlib
