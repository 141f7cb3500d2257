package raftnode

import (
	"io"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// trackingFSM wraps the caller's FSM to learn which log index the FSM has
// actually consumed. raft's AppliedIndex only says what was handed to the
// FSM goroutine, not what the FSM finished; WaitReady needs the latter.
//
// The wrapper is always a raft.BatchingFSM (so raft uses its batch path) and
// reproduces exactly what raft would have done with the inner FSM:
//   - inner is a BatchingFSM: the batch (commands and configurations, as raft
//     sends them) goes to inner.ApplyBatch unchanged;
//   - otherwise commands go to inner.Apply one by one, configurations go to
//     inner.StoreConfiguration if inner is a raft.ConfigurationStore and
//     are otherwise dropped, as raft does for a plain FSM.
type trackingFSM struct {
	inner    raft.FSM
	batching raft.BatchingFSM        // non-nil if inner batches
	confs    raft.ConfigurationStore // non-nil if inner stores configurations

	// seen is the index of the last log entry the inner FSM has consumed
	// through Apply/ApplyBatch/StoreConfiguration (not through Restore).
	seen atomic.Uint64
}

var _ raft.BatchingFSM = (*trackingFSM)(nil)

func newTrackingFSM(inner raft.FSM) *trackingFSM {
	t := &trackingFSM{inner: inner}
	t.batching, _ = inner.(raft.BatchingFSM)
	t.confs, _ = inner.(raft.ConfigurationStore)
	return t
}

func (t *trackingFSM) Apply(l *raft.Log) interface{} {
	// Only reached if raft ever bypasses the batch path; keep the same
	// semantics as ApplyBatch.
	return t.ApplyBatch([]*raft.Log{l})[0]
}

func (t *trackingFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	if len(logs) == 0 {
		return nil
	}
	var resp []interface{}
	if t.batching != nil {
		resp = t.batching.ApplyBatch(logs)
	} else {
		resp = make([]interface{}, len(logs))
		for i, l := range logs {
			switch l.Type {
			case raft.LogCommand:
				resp[i] = t.inner.Apply(l)
			case raft.LogConfiguration:
				if t.confs != nil {
					t.confs.StoreConfiguration(l.Index, raft.DecodeConfiguration(l.Data))
				}
			}
		}
	}
	t.seen.Store(logs[len(logs)-1].Index)
	return resp
}

func (t *trackingFSM) Snapshot() (raft.FSMSnapshot, error) { return t.inner.Snapshot() }

func (t *trackingFSM) Restore(rc io.ReadCloser) error { return t.inner.Restore(rc) }

// fsmVisible reports whether raft hands entries of this type to the FSM
// goroutine's batch (barriers and no-ops never reach the FSM itself).
func fsmVisible(t raft.LogType) bool {
	return t == raft.LogCommand || t == raft.LogConfiguration
}
