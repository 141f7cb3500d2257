package partitionlimit

import "time"

// Remote states reported in Stats.Remote.
const (
	RemoteLocalOnly   = "local-only"  // no Addrs configured
	RemoteConnected   = "connected"   // the last push succeeded and a watch stream is open
	RemoteDegraded    = "degraded"    // pushes or the watch stream fail; deciding from what is held
	RemoteUnreachable = "unreachable" // no node answered: deciding from local and last-received sketches (fail open on the remote part)
)

// Rejection reasons in Stats.Rejected.
const (
	ReasonLimit   = "partition_limit" // a partition would exceed max_series_per_partition
	ReasonInvalid = "invalid"         // bad tenant id or partition out of range
)

// Stats is a snapshot of a Limiter's counters (monotonic since New) and gauges.
type Stats struct {
	Checks    uint64            // Check calls
	Unlimited uint64            // of which for tenants without a limit (not tracked)
	Accepted  uint64            // of which accepted and recorded
	Rejected  map[string]uint64 // of which rejected, by reason (ReasonLimit, ReasonInvalid)

	Pushes         uint64 // successful PushSketches calls
	PushFailures   uint64 // pushes no node accepted (kept, retried next interval)
	PushRejected   uint64 // pushes refused with InvalidArgument (dropped)
	SketchesPushed uint64
	BytesPushed    uint64 // protobuf bytes of successful pushes
	// Resends counts full pushes of every in-window sketch, made after the
	// node accepting pushes changed (failover or restart): what the previous
	// node accepted but had not passed on may have died with it.
	Resends uint64

	BatchesReceived  uint64 // WatchSketches batches merged
	SketchesReceived uint64
	BytesReceived    uint64
	BadReceived      uint64 // received sketches that failed validation (ignored)
	WatchReconnects  uint64

	Remote      string    // RemoteLocalOnly, RemoteConnected, RemoteDegraded or RemoteUnreachable
	LastPush    time.Time // last successful push (zero: none)
	LastReceive time.Time // last merged batch (zero: none)

	Tenants    int // tenants with state
	Partitions int // (tenant, partition) states held
}

// Stats returns the current counters.
func (l *Limiter) Stats() Stats {
	c := &l.st
	out := Stats{
		Checks: c.checks.Load(), Unlimited: c.unlimited.Load(), Accepted: c.accepted.Load(),
		Rejected: map[string]uint64{ReasonLimit: c.rejectedLimit.Load(), ReasonInvalid: c.rejectedInvalid.Load()},
		Pushes:   c.pushes.Load(), PushFailures: c.pushFailures.Load(), PushRejected: c.pushRejected.Load(),
		SketchesPushed: c.sketchesPushed.Load(), BytesPushed: c.bytesPushed.Load(), Resends: c.resends.Load(),
		BatchesReceived: c.batchesReceived.Load(), SketchesReceived: c.sketchesReceived.Load(),
		BytesReceived: c.bytesReceived.Load(), BadReceived: c.badReceived.Load(), WatchReconnects: c.watchReconnects.Load(),
	}
	if t := c.lastPushUnixNano.Load(); t != 0 {
		out.LastPush = time.Unix(0, t)
	}
	if t := c.lastReceiveUnixNano.Load(); t != 0 {
		out.LastReceive = time.Unix(0, t)
	}
	switch ok, w := c.remoteOK.Load(), c.watching.Load(); {
	case l.sy == nil:
		out.Remote = RemoteLocalOnly
	case ok && w:
		out.Remote = RemoteConnected
	case ok || w:
		out.Remote = RemoteDegraded
	default:
		out.Remote = RemoteUnreachable
	}
	for _, ts := range l.tenantList() {
		out.Tenants++
		ts.mu.Lock()
		out.Partitions += len(ts.parts)
		ts.mu.Unlock()
	}
	return out
}
