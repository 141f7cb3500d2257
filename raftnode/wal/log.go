package wal

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// Log is one group's view of the shared log: a raft.LogStore and a
// raft.MonotonicLogStore (raft removes the whole log after installing a
// snapshot instead of leaving a hole in it).
type Log struct {
	w     *WAL
	group uint16
}

var (
	_ raft.LogStore          = (*Log)(nil)
	_ raft.MonotonicLogStore = (*Log)(nil)
)

// Group returns group g's log.
func (w *WAL) Group(g uint16) *Log { return &Log{w: w, group: g} }

// IsMonotonic implements raft.MonotonicLogStore.
func (l *Log) IsMonotonic() bool { return true }

// FirstIndex implements raft.LogStore (0 when empty).
func (l *Log) FirstIndex() (uint64, error) {
	l.w.mu.RLock()
	defer l.w.mu.RUnlock()
	if st := l.w.groups[l.group]; st != nil {
		return st.first, nil
	}
	return 0, nil
}

// LastIndex implements raft.LogStore (0 when empty).
func (l *Log) LastIndex() (uint64, error) {
	l.w.mu.RLock()
	defer l.w.mu.RUnlock()
	if st := l.w.groups[l.group]; st != nil {
		return st.last, nil
	}
	return 0, nil
}

// GetLog implements raft.LogStore: it reads the entry back from its segment
// and checks its checksum.
func (l *Log) GetLog(index uint64, out *raft.Log) error {
	l.w.mu.RLock()
	defer l.w.mu.RUnlock()
	st := l.w.groups[l.group]
	if st == nil || st.empty() || index < st.first || index > st.last {
		return raft.ErrLogNotFound
	}
	at := st.locs[index-st.first]
	if at.seg.f == nil {
		return ErrClosed
	}
	buf := make([]byte, at.n)
	if _, err := at.seg.f.ReadAt(buf, at.off); err != nil {
		return fmt.Errorf("wal: read group %d entry %d from %s at %d: %w", l.group, index, at.seg.path, at.off, err)
	}
	r, _, err := decodeRecord(buf)
	if err != nil {
		return fmt.Errorf("%w: group %d entry %d in %s at %d: %v", ErrCorrupt, l.group, index, at.seg.path, at.off, err)
	}
	if r.kind != kindEntry || r.group != l.group || r.index != index {
		return fmt.Errorf("%w: %s at %d holds group %d index %d, want group %d entry %d", ErrCorrupt, at.seg.path, at.off, r.group, r.index, l.group, index)
	}
	*out = raft.Log{Index: r.index, Term: r.term, Type: raft.LogType(r.typ), Data: r.data}
	if len(r.ext) > 0 {
		out.Extensions = r.ext
	}
	if r.appendedAt != 0 {
		out.AppendedAt = time.Unix(0, r.appendedAt).UTC()
	}
	return nil
}

// StoreLog implements raft.LogStore.
func (l *Log) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

// StoreLogs implements raft.LogStore: the entries must be consecutive and
// follow the last one (or start an empty log). It returns once they are
// durable.
func (l *Log) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	size := 0
	for i, e := range logs {
		if i > 0 && e.Index != logs[i-1].Index+1 {
			return fmt.Errorf("wal: group %d: entries not consecutive (%d after %d)", l.group, e.Index, logs[i-1].Index)
		}
		size += recHdrLen + bodyFixedLen + len(e.Extensions) + len(e.Data)
	}
	if logs[0].Index == 0 {
		return fmt.Errorf("wal: group %d: entry index 0", l.group)
	}
	r := &request{group: l.group, kind: kindEntry, index: logs[0].Index, count: len(logs),
		buf: make([]byte, 0, size), offs: make([]uint32, len(logs))}
	for i, e := range logs {
		r.offs[i] = uint32(len(r.buf))
		var at int64
		if !e.AppendedAt.IsZero() {
			at = e.AppendedAt.UnixNano()
		}
		r.buf = appendRecord(r.buf, l.group, kindEntry, uint8(e.Type), e.Index, e.Term, at, e.Extensions, e.Data)
	}
	return l.w.submit(r)
}

// DeleteRange implements raft.LogStore. raft deletes either a prefix
// (compaction after a snapshot, or the whole log) or a suffix (a
// follower's conflicting entries); a range strictly inside the log is
// refused.
func (l *Log) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	l.w.mu.RLock()
	var first, last uint64
	if st := l.w.groups[l.group]; st != nil {
		first, last = st.first, st.last
	}
	l.w.mu.RUnlock()
	var r *request
	switch {
	case first == 0 || max < first || min > last:
		return nil // nothing of it is here
	case min <= first:
		r = &request{group: l.group, kind: kindCompact, index: max}
	case max >= last:
		r = &request{group: l.group, kind: kindTruncate, index: min - 1}
	default:
		return fmt.Errorf("wal: group %d: cannot delete %d..%d from the middle of %d..%d", l.group, min, max, first, last)
	}
	r.buf = appendRecord(nil, l.group, r.kind, 0, r.index, 0, 0, nil, nil)
	return l.w.submit(r)
}

// Groups lists the groups that have a non-empty log.
func (w *WAL) Groups() []uint16 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []uint16
	for g, st := range w.groups {
		if !st.empty() {
			out = append(out, g)
		}
	}
	return out
}
