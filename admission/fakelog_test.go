package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
)

// fakeLog stands in for raft in this package's tests, the one place a fake is
// used: the failure paths (an append refused, leadership lost after an append,
// an enqueue timeout, failing barriers) cannot be produced on demand with a real
// raft group. Committed entries are applied to a real *fsm.FSM in log order, as
// raft would, so decisions read real committed state.
type fakeLog struct {
	f *fsm.FSM

	mu         sync.Mutex
	index      uint64
	applyErrs  []error         // outcome of the next appends: nil commits; exhausted: commit
	barrierErr []error         // outcome of the next barriers; exhausted: success
	gate       chan struct{}   // when set, appends complete (commit or fail) only once it is closed
	barrierGt  chan struct{}   // when set, barriers complete only once it is closed
	entries    []fsm.Entry     // appended entries, decoded, in log order (unless noRecord)
	noRecord   bool            // benchmarks: keep no copy of the entries
	applies    int             // Apply calls
	barriers   int             // Barrier calls
	waiters    []chan struct{} // closed at every Apply (see waitApplies)
}

func newFakeLog(t testing.TB, f *fsm.FSM) *fakeLog {
	t.Helper()
	return &fakeLog{f: f}
}

func (l *fakeLog) Apply(data []byte, _ time.Duration) ApplyFuture {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applies++
	for _, w := range l.waiters {
		close(w)
	}
	l.waiters = nil
	var err error
	if len(l.applyErrs) > 0 {
		err, l.applyErrs = l.applyErrs[0], l.applyErrs[1:]
	}
	if !l.noRecord {
		if e, derr := fsm.DecodeEntry(data); derr == nil {
			l.entries = append(l.entries, e)
		}
	}
	fut := &fakeFuture{err: err, wait: l.gate}
	if err != nil {
		return fut // refused, or appended but never committed here
	}
	l.index++
	entry := &raft.Log{Index: l.index, Term: 1, Type: raft.LogCommand, Data: append([]byte(nil), data...)}
	if l.gate == nil {
		fut.resp = l.f.Apply(entry) // committed before Apply returns, as raft may do
		return fut
	}
	fut.commit = func() any { return l.f.Apply(entry) }
	return fut
}

func (l *fakeLog) Barrier(time.Duration) Future {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.barriers++
	var err error
	if len(l.barrierErr) > 0 {
		err, l.barrierErr = l.barrierErr[0], l.barrierErr[1:]
	}
	return &fakeFuture{err: err, wait: l.barrierGt}
}

// commit applies an entry directly, as if committed before the test began.
func (l *fakeLog) commit(data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	l.f.Apply(&raft.Log{Index: l.index, Term: 1, Type: raft.LogCommand, Data: data})
}

// waitApplies blocks until Apply was called at least n times.
func (l *fakeLog) waitApplies(n int) {
	for {
		l.mu.Lock()
		if l.applies >= n {
			l.mu.Unlock()
			return
		}
		w := make(chan struct{})
		l.waiters = append(l.waiters, w)
		l.mu.Unlock()
		<-w
	}
}

func (l *fakeLog) snapshot() (entries []fsm.Entry, barriers int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]fsm.Entry(nil), l.entries...), l.barriers
}

// fakeFuture completes at once, or once wait is closed; a gated commit is applied
// by the first Error call (the session's completer, in log order).
type fakeFuture struct {
	err    error
	wait   chan struct{}
	commit func() any
	once   sync.Once
	resp   any
}

func (f *fakeFuture) Error() error {
	if f.wait != nil {
		<-f.wait
	}
	f.once.Do(func() {
		if f.commit != nil {
			f.resp = f.commit()
		}
	})
	return f.err
}

func (f *fakeFuture) Response() any { return f.resp }
