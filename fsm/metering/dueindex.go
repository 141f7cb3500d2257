package metering

import (
	"container/heap"
	"math"
	"sync"

	"github.com/tollgate-io/tollgate/metering/interval"
)

// dueIndex lets the sampler find the spans with work at a time without
// reading every span: with a million open spans a pass costs in proportion to
// the spans that are due, not to all of them.
//
// A span left alone has work from one instant on, which Plan tells from the
// span alone (dueFrom): at once when it has a planned interval or a late stop
// to walk back, at the next grid boundary after its cursor (or at its end,
// if earlier) otherwise, never once it is complete. The index keeps every
// span under that instant: a heap of the future instants, each with the ids
// waiting for it, and the set of ids whose instant has come. Entries are
// never removed eagerly: when a span changes, the apply path files it again
// under its new instant (touch), and an entry that no longer matches its
// span is dropped when it is read. The index is derived state: not
// replicated, not in snapshots, rebuilt from the spans when the grid changes
// or after a restore.
type dueIndex struct {
	mu      sync.Mutex
	built   bool
	grid    interval.Grid
	times   int64Heap           // distinct future instants with waiting ids
	waiting map[int64][]uint64  // instant → ids filed under it (may be stale)
	ready   map[uint64]struct{} // ids whose instant has come
}

// dueNow is the instant of a span with work at any time.
const dueNow = math.MinInt64

// dueFrom is the instant from which s has work under gr, and false when it
// never will (stopped and fully sampled).
func dueFrom(gr interval.Grid, s *Span) (int64, bool) {
	if s.Planned != nil {
		return dueNow, true
	}
	// With the planner's clock at the cursor, Plan answers Sample only for
	// work that needs no time to pass (a late stop), and otherwise Wait with
	// the first instant at which it will answer Sample.
	_, d, wake := gr.Plan(s.Cursor, s.End, s.Stopped, s.Cursor)
	switch d {
	case interval.Sample:
		return dueNow, true
	case interval.Wait:
		return wake, true
	}
	return 0, false
}

// file puts id under its instant t. Callers hold mu.
func (x *dueIndex) file(id uint64, t int64) {
	if t == dueNow {
		x.ready[id] = struct{}{}
		return
	}
	ids, ok := x.waiting[t]
	if !ok {
		heap.Push(&x.times, t)
	}
	x.waiting[t] = append(ids, id)
}

// touch files a span that was created or changed (nil: removed, which needs
// nothing: its entries are dropped when read). Called on the apply path with
// the module's write lock held.
func (x *dueIndex) touch(s *Span) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.built || s == nil {
		return
	}
	if t, ok := dueFrom(x.grid, s); ok {
		x.file(s.ID, t)
	}
}

// invalidate drops the index (after a restore replaced every span).
func (x *dueIndex) invalidate() {
	x.mu.Lock()
	x.built = false
	x.times, x.waiting, x.ready = nil, nil, nil
	x.mu.Unlock()
}

// rebuild files every span under gr. Callers hold mu and the module's lock.
func (x *dueIndex) rebuild(gr interval.Grid, spans map[uint64]*Span) {
	x.built, x.grid = true, gr
	x.times, x.waiting, x.ready = nil, map[int64][]uint64{}, map[uint64]struct{}{}
	for _, s := range spans {
		if t, ok := dueFrom(gr, s); ok {
			x.file(s.ID, t)
		}
	}
}

// advance moves the ids filed under instants up to t into ready, keeping
// those whose span still waits for that instant. Callers hold mu and the
// module's lock.
func (x *dueIndex) advance(t int64, spans map[uint64]*Span) {
	for len(x.times) > 0 && x.times[0] <= t {
		at := heap.Pop(&x.times).(int64)
		for _, id := range x.waiting[at] {
			if s := spans[id]; s != nil {
				if due, ok := dueFrom(x.grid, s); ok && due == at {
					x.ready[id] = struct{}{}
				}
			}
		}
		delete(x.waiting, at)
	}
}

// next is the earliest future instant at which a span waits (0: none).
// Instants whose every entry went stale (the span changed or went) are
// dropped on the way; a live instant is usually confirmed by its first
// entry, so this costs in proportion to the stale entries it drops.
func (x *dueIndex) next(spans map[uint64]*Span) int64 {
	for len(x.times) > 0 {
		at := x.times[0]
		ids := x.waiting[at]
		for i, id := range ids {
			if s := spans[id]; s != nil {
				if due, ok := dueFrom(x.grid, s); ok && due == at {
					x.waiting[at] = ids[i:]
					return at
				}
			}
		}
		heap.Pop(&x.times)
		delete(x.waiting, at)
	}
	return 0
}

type int64Heap []int64

func (h int64Heap) Len() int           { return len(h) }
func (h int64Heap) Less(i, j int) bool { return h[i] < h[j] }
func (h int64Heap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *int64Heap) Push(v any)        { *h = append(*h, v.(int64)) }
func (h *int64Heap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
