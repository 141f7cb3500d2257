package admission

import (
	"time"

	"github.com/hashicorp/raft"
)

// State is what the leader path reads and reserves in the group's committed
// state. *fsm.FSM satisfies it; every method must be safe to call concurrently
// with the FSM's apply.
type State interface {
	// Lookup writes fsm.StateAbsent/StateActive/StateFresh per hash of tenant at
	// Unix minute now with the given idle timeout into out.
	Lookup(tenant string, hashes []uint64, now int64, idle int, out []uint8)
	// TenantUsage returns active series and this node's outstanding
	// reservations; applying an entry moves its new count from one to the other
	// atomically, so their sum is exact at every instant.
	TenantUsage(tenant string) (active, reserved int64)
	// Reserve counts n series of tenant logged as new by this leader; applying
	// the entry releases them.
	Reserve(tenant string, n int64)
	// ResetReservations drops reservations left by entries that never committed.
	ResetReservations()
	// Now is the highest Unix minute applied.
	Now() int64
	// AppliedIndex is the raft index of the last applied entry.
	AppliedIndex() uint64
}

// Future is a pending log operation; Error blocks until it is done. It is not
// safe for two goroutines to wait on the same future (hashicorp/raft's rule).
type Future interface {
	Error() error
}

// ApplyFuture is a pending append: Error returns once the entry was applied to
// the local FSM (or failed); Response is what the FSM's Apply returned.
type ApplyFuture interface {
	Future
	Response() any
}

// Log is the replicated log of the group as its leader sees it.
type Log interface {
	// Apply appends data; the future completes after the entry committed and was
	// applied locally.
	Apply(data []byte, timeout time.Duration) ApplyFuture
	// Barrier completes once every entry appended before it was applied locally.
	Barrier(timeout time.Duration) Future
}

// RaftLog adapts *raft.Raft to Log.
func RaftLog(r *raft.Raft) Log { return raftLog{r} }

type raftLog struct{ r *raft.Raft }

func (l raftLog) Apply(data []byte, timeout time.Duration) ApplyFuture {
	return l.r.Apply(data, timeout)
}

func (l raftLog) Barrier(timeout time.Duration) Future { return l.r.Barrier(timeout) }

// Metrics receives the leader path's counters; the server binds them to its
// registry and group label. Calls come from the session goroutines and must not
// block.
type Metrics interface {
	SeriesDecided(created, refreshed, rejected int)
	EntryAppended(bytes, hashes int)
	CommitLatency(d time.Duration)
}

type noMetrics struct{}

func (noMetrics) SeriesDecided(int, int, int)   {}
func (noMetrics) EntryAppended(int, int)        {}
func (noMetrics) CommitLatency(d time.Duration) {}
