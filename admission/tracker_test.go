package admission

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
)

// testMinute is the Unix minute every test clock shows.
const testMinute = 29_000_000

type harness struct {
	tr  *Tracker
	log *fakeLog
	f   *fsm.FSM
}

// newHarness builds a tracker on a real FSM and a fake log. The FSM already
// applied an expire entry at testMinute, so a session appends no expire entry of
// its own and the log holds exactly the track entries the test causes.
func newHarness(t testing.TB, shares map[string]int64, script func(*fakeLog), opts ...func(*Config)) *harness {
	t.Helper()
	f, err := fsm.New(fsm.Config{Partitions: 4, Groups: 1, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	lg := newFakeLog(t, f)
	lg.commit(fsm.AppendExpire(nil, testMinute, 20))
	if script != nil {
		script(lg)
	}
	cfg := Config{
		IdleMinutes:    20,
		MaxBatchHashes: 10_000,
		MaxInFlight:    4,
		ApplyTimeout:   time.Second,
		Clock:          func() time.Time { return time.Unix(testMinute*60+30, 0) },
		Share:          func(tenant string) int64 { return shares[tenant] },
	}
	for _, o := range opts {
		o(&cfg)
	}
	tr := New(cfg, f, lg)
	h := &harness{tr: tr, log: lg, f: f}
	t.Cleanup(func() { h.stop() })
	return h
}

// stop ends leadership and waits until the last session answered everything.
func (h *harness) stop() {
	h.tr.SetLeader(false)
	h.tr.mu.Lock()
	s := h.tr.last
	h.tr.mu.Unlock()
	if s != nil {
		<-s.finished
	}
}

// waitReady waits for a session that passed its barrier (the test binary's
// timeout bounds the wait; nothing here is timed).
func (h *harness) waitReady() {
	for !h.tr.Ready() {
		time.Sleep(time.Millisecond)
	}
}

// waitQueued waits until n requests sit undecided in the current session's queue.
func (h *harness) waitQueued(t *testing.T, n int) {
	t.Helper()
	s := h.tr.current()
	if s == nil {
		t.Fatal("no session")
	}
	for len(s.reqCh) < n {
		time.Sleep(time.Millisecond)
	}
}

type reply struct {
	rejected []uint64
	err      error
}

func (h *harness) trackAsync(ctx context.Context, tenant string, hashes ...uint64) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		rej, err := h.tr.Track(ctx, tenant, hashes)
		ch <- reply{rej, err}
	}()
	return ch
}

func (h *harness) states(tenant string, hashes ...uint64) []uint8 {
	out := make([]uint8, len(hashes))
	h.f.Lookup(tenant, hashes, testMinute, 20, out)
	return out
}

func loggedHashes(entries []fsm.Entry) []uint64 {
	var hs []uint64
	for _, e := range entries {
		for _, th := range e.Tenants {
			hs = append(hs, th.Hashes...)
		}
	}
	return hs
}

func TestTrackAcceptsAfterCommitAndCountsExactly(t *testing.T) {
	h := newHarness(t, map[string]int64{"a": 3}, nil)
	if _, err := h.tr.Track(context.Background(), "a", []uint64{1}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("before SetLeader: err = %v, want ErrNotLeader", err)
	}
	h.tr.SetLeader(true)
	h.waitReady()
	rej, err := h.tr.Track(context.Background(), "a", []uint64{1, 2, 3, 4, 5})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rej, []uint64{4, 5}) {
		t.Fatalf("rejected %v, want [4 5] (share 3, request order)", rej)
	}
	if got := h.states("a", 1, 2, 3, 4); !slices.Equal(got, []uint8{fresh, fresh, fresh, absent}) {
		t.Fatalf("committed states %v: accepted hashes must be applied when Track returns", got)
	}
	if a, r := h.f.TenantUsage("a"); a != 3 || r != 0 {
		t.Fatalf("usage active=%d reserved=%d, want 3 and 0", a, r)
	}
	// At the share: a refresh is still accepted, a new series is not.
	rej, err = h.tr.Track(context.Background(), "a", []uint64{2, 6})
	if err != nil || !slices.Equal(rej, []uint64{6}) {
		t.Fatalf("at share: rejected %v err %v, want [6]", rej, err)
	}
}

func TestReplyWaitsForCommitAndPendingResendIsNotLoggedAgain(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, map[string]int64{"a": 1}, func(l *fakeLog) { l.gate = gate })
	h.tr.SetLeader(true)
	h.waitReady()
	first := h.trackAsync(context.Background(), "a", 42)
	h.log.waitApplies(1)
	select {
	case r := <-first:
		t.Fatalf("Track returned %+v before its entry committed", r)
	default:
	}
	// The re-send is decided while the first entry is in flight: with a share of
	// 1 and the reservation counted, only the pending set lets it through.
	second := h.trackAsync(context.Background(), "a", 42)
	h.waitDecided(second)
	close(gate)
	for i, ch := range []<-chan reply{first, second} {
		if r := <-ch; r.err != nil || len(r.rejected) != 0 {
			t.Fatalf("request %d: %+v, want accepted", i, r)
		}
	}
	entries, _ := h.log.snapshot()
	if got := loggedHashes(entries); !slices.Equal(got, []uint64{42}) {
		t.Fatalf("logged %v, want 42 exactly once", got)
	}
	if a, r := h.f.TenantUsage("a"); a != 1 || r != 0 {
		t.Fatalf("usage active=%d reserved=%d, want 1 and 0", a, r)
	}
}

// waitDecided waits until the decider took the second request and enqueued its
// batch behind the first, whose commit the gate holds back (the completer holds
// the first batch, so the second one waits in the in-flight queue).
func (h *harness) waitDecided(ch <-chan reply) {
	s := h.tr.current()
	for len(s.reqCh) > 0 || len(s.inflight) < 1 {
		select {
		case r := <-ch:
			panic("reply before the gate opened: " + errString(r.err))
		default:
		}
		time.Sleep(time.Millisecond)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestApplyRefusedStepsDownAndClearsPendingAndReservations(t *testing.T) {
	h := newHarness(t, map[string]int64{"a": 10}, func(l *fakeLog) {
		l.applyErrs = []error{raft.ErrNotLeader}
	})
	h.tr.SetLeader(true)
	h.waitReady()
	old := h.tr.current()
	_, err := h.tr.Track(context.Background(), "a", []uint64{1, 2})
	if !errors.Is(err, ErrStepDown) || !errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("err = %v, want ErrStepDown wrapping raft.ErrNotLeader", err)
	}
	old.pmu.Lock()
	left := 0
	for _, n := range livePending(old.pending) {
		left += len(n) // an emptied table may stay, for reuse
	}
	old.pmu.Unlock()
	if left != 0 {
		t.Fatalf("failed session still holds %d pending hashes", left)
	}
	// The node still leads: a new session takes over, resets the reservation
	// the refused entry left behind, and the retry succeeds.
	for h.tr.current() == old {
		time.Sleep(time.Millisecond)
	}
	h.waitReady()
	if a, r := h.f.TenantUsage("a"); a != 0 || r != 0 {
		t.Fatalf("after the new session's barrier: active=%d reserved=%d, want 0 and 0", a, r)
	}
	if rej, err := h.tr.Track(context.Background(), "a", []uint64{1, 2}); err != nil || len(rej) != 0 {
		t.Fatalf("retry: rejected %v err %v", rej, err)
	}
	if a, r := h.f.TenantUsage("a"); a != 2 || r != 0 {
		t.Fatalf("after retry: active=%d reserved=%d, want 2 and 0", a, r)
	}
}

func TestLeadershipLostAfterAppend(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) {
		l.gate = gate
		l.applyErrs = []error{raft.ErrLeadershipLost, nil}
	})
	h.tr.SetLeader(true)
	h.waitReady()
	first := h.trackAsync(context.Background(), "a", 1)
	h.log.waitApplies(1)
	second := h.trackAsync(context.Background(), "a", 2)
	h.log.waitApplies(2)
	close(gate)
	r1, r2 := <-first, <-second
	if !errors.Is(r1.err, ErrStepDown) || !errors.Is(r1.err, raft.ErrLeadershipLost) {
		t.Fatalf("first: err = %v, want ErrStepDown wrapping raft.ErrLeadershipLost", r1.err)
	}
	// The second entry committed, but it was appended by a session that lost
	// its footing: its reply must not claim more than "maybe".
	if !errors.Is(r2.err, ErrStepDown) {
		t.Fatalf("second: err = %v, want ErrStepDown", r2.err)
	}
	h.tr.SetLeader(false)
	if _, err := h.tr.Track(context.Background(), "a", []uint64{3}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("after SetLeader(false): err = %v, want ErrNotLeader", err)
	}
}

func TestEnqueueTimeoutThenRecovers(t *testing.T) {
	h := newHarness(t, nil, func(l *fakeLog) { l.applyErrs = []error{raft.ErrEnqueueTimeout} })
	h.tr.SetLeader(true)
	h.waitReady()
	old := h.tr.current()
	_, err := h.tr.Track(context.Background(), "a", []uint64{1})
	if !errors.Is(err, raft.ErrEnqueueTimeout) || errors.Is(err, ErrStepDown) {
		t.Fatalf("err = %v, want raft.ErrEnqueueTimeout as it is", err)
	}
	for h.tr.current() == old {
		time.Sleep(time.Millisecond)
	}
	h.waitReady()
	if rej, err := h.tr.Track(context.Background(), "a", []uint64{1}); err != nil || len(rej) != 0 {
		t.Fatalf("a leader must not stay stuck after a timeout: rejected %v err %v", rej, err)
	}
}

func TestBarrierFailsThenSucceeds(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) {
		l.barrierGt = gate
		l.barrierErr = []error{raft.ErrEnqueueTimeout, raft.ErrLeadershipTransferInProgress}
	})
	h.tr.SetLeader(true)
	if h.tr.Ready() {
		t.Fatal("ready before the leader barrier completed")
	}
	close(gate)
	h.waitReady()
	if _, barriers := h.log.snapshot(); barriers != 3 {
		t.Fatalf("%d barriers, want 3 (two failures, one success)", barriers)
	}
	if rej, err := h.tr.Track(context.Background(), "a", []uint64{1}); err != nil || len(rej) != 0 {
		t.Fatalf("rejected %v err %v", rej, err)
	}
}

func TestStopWithQueuedRequestsAnswersNotLeader(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) {
		l.barrierGt = gate
		l.barrierErr = []error{raft.ErrNotLeader}
	})
	h.tr.SetLeader(true)
	replies := []<-chan reply{
		h.trackAsync(context.Background(), "a", 1),
		h.trackAsync(context.Background(), "b", 2),
		h.trackAsync(context.Background(), "a", 3),
	}
	h.waitQueued(t, len(replies))
	h.tr.SetLeader(false)
	close(gate)
	for i, ch := range replies {
		if r := <-ch; !errors.Is(r.err, ErrNotLeader) {
			t.Fatalf("request %d: %+v, want ErrNotLeader (never decided)", i, r)
		}
	}
	if entries, _ := h.log.snapshot(); len(entries) != 0 {
		t.Fatalf("%d entries appended by a session that never decided", len(entries))
	}
}

func TestCancelledBeforeDecisionIsNotLogged(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) { l.barrierGt = gate })
	h.tr.SetLeader(true)
	ctx, cancel := context.WithCancel(context.Background())
	gone := h.trackAsync(ctx, "a", 1)
	h.waitQueued(t, 1)
	kept := h.trackAsync(context.Background(), "a", 2)
	h.waitQueued(t, 2)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled request: %+v, want context.Canceled", r)
	}
	close(gate)
	if r := <-kept; r.err != nil || len(r.rejected) != 0 {
		t.Fatalf("live request: %+v", r)
	}
	entries, _ := h.log.snapshot()
	if got := loggedHashes(entries); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("logged %v, want only the live request's hash 2", got)
	}
	if got := h.states("a", 1); got[0] != absent {
		t.Fatal("the cancelled request's hash was recorded")
	}
}

// Exclusive refuses without a ready session; inside it, usage includes every
// decided new series, and a share lowered inside it holds for the next batch.
func TestExclusive(t *testing.T) {
	shares := map[string]int64{"a": 10}
	var mu sync.Mutex
	h := newHarness(t, nil, nil, func(c *Config) {
		c.Share = func(tn string) int64 { mu.Lock(); defer mu.Unlock(); return shares[tn] }
	})
	if err := h.tr.Exclusive(func() error { t.Fatal("fn ran without a session"); return nil }); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("without a session: %v", err)
	}
	h.tr.SetLeader(true)
	h.waitReady()
	rej, atShare, err := h.tr.TrackAtShare(context.Background(), "a", []uint64{1, 2, 3, 4})
	if err != nil || len(rej) != 0 || atShare != 0 {
		t.Fatalf("track: %v %d %v", rej, atShare, err)
	}
	err = h.tr.Exclusive(func() error {
		active, reserved := h.f.TenantUsage("a")
		if active+reserved != 4 {
			t.Errorf("usage inside Exclusive %d+%d, want 4", active, reserved)
		}
		mu.Lock()
		shares["a"] = 5 // give 5 of the 6 free away
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rej, atShare, err = h.tr.TrackAtShare(context.Background(), "a", []uint64{5, 6, 7})
	if err != nil || !slices.Equal(rej, []uint64{6, 7}) || atShare != 2 {
		t.Fatalf("after lowering: rejected %v at share %d %v", rej, atShare, err)
	}
}

// A leader whose session fails (an append times out) starts a new one while
// raft still names it leader. Requests the failed session had queued but not
// decided go to the successor instead of being answered NotLeader about this
// very node (which clients would bounce off for as long as the successor's
// barrier takes).
func TestReplacedSessionTakesUndecidedRequests(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) {
		l.gate = gate
		l.applyErrs = []error{raft.ErrEnqueueTimeout}
	}, func(c *Config) { c.MaxInFlight = 1 })
	h.tr.SetLeader(true)
	h.waitReady()
	old := h.tr.current()
	// A's append fails once the gate opens; B and C are appended behind it
	// (one in the completer's queue, one blocked on it); D and E wait in the
	// session's queue, undecided.
	a := h.trackAsync(context.Background(), "a", 1)
	h.log.waitApplies(1)
	b := h.trackAsync(context.Background(), "a", 2)
	h.log.waitApplies(2)
	c := h.trackAsync(context.Background(), "a", 3)
	h.log.waitApplies(3)
	d := h.trackAsync(context.Background(), "a", 4)
	e := h.trackAsync(context.Background(), "a", 5)
	h.waitQueued(t, 2)
	close(gate)

	if r := <-a; !errors.Is(r.err, raft.ErrEnqueueTimeout) {
		t.Fatalf("A: %+v, want its append's error", r)
	}
	for name, ch := range map[string]<-chan reply{"B": b, "C": c} {
		// Appended by a session that failed: committed or not, only "maybe".
		if r := <-ch; !errors.Is(r.err, ErrStepDown) {
			t.Fatalf("%s: %+v, want ErrStepDown", name, r)
		}
	}
	for name, ch := range map[string]<-chan reply{"D": d, "E": e} {
		if r := <-ch; r.err != nil || len(r.rejected) != 0 {
			t.Fatalf("%s (queued, undecided, this node still leads): %+v, want accepted by the next session", name, r)
		}
	}
	if h.tr.current() == old {
		t.Fatal("D and E were answered, yet the failed session is still current")
	}
	if st := h.states("a", 4, 5); st[0] == 0 || st[1] == 0 {
		t.Fatalf("D and E not active after their acceptance: states %v", st)
	}
}

// Without leadership nothing waits, whatever SessionWait says: a node that
// does not lead answers NotLeader at once.
func TestNoSessionWaitWithoutLeadership(t *testing.T) {
	h := newHarness(t, nil, nil, func(c *Config) { c.SessionWait = time.Hour })
	if _, err := h.tr.Track(context.Background(), "a", []uint64{1}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("never led: err = %v, want ErrNotLeader", err)
	}
}

// TestBatchWindowOnlyWhileBusy: the decider waits for a batch window's worth
// of requests only while an earlier batch is unanswered (its entry is then
// being appended, and what arrives meanwhile shares the next entry). An idle
// leader appends a request at once: a timer-driven wait there bought nothing
// and cost about a millisecond, the Go runtime's timer resolution when idle.
func TestBatchWindowOnlyWhileBusy(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, nil, func(l *fakeLog) { l.gate = gate }, func(c *Config) {
		c.BatchWindow = time.Hour
		c.MaxBatchHashes = 4
	})
	h.tr.SetLeader(true)
	h.waitReady()
	ctx := context.Background()
	appended := func(n int, what string) {
		t.Helper()
		done := make(chan struct{})
		go func() { h.log.waitApplies(n); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a hang guard; the window is an hour
			t.Fatalf("%s: not appended; held for the batch window", what)
		}
	}
	first := h.trackAsync(ctx, "a", 1, 2)
	appended(1, "a request to an idle leader")
	// The first entry is unanswered (the gate holds its commit): these two
	// wait for each other, up to the window, and fill one entry.
	second := h.trackAsync(ctx, "a", 3, 4)
	third := h.trackAsync(ctx, "a", 5, 6)
	appended(2, "requests behind an unanswered batch")
	close(gate)
	for i, ch := range []<-chan reply{first, second, third} {
		if r := <-ch; r.err != nil || len(r.rejected) != 0 {
			t.Fatalf("request %d: %+v, want accepted", i, r)
		}
	}
	entries, _ := h.log.snapshot()
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2 (the first request alone, then the other two together)", len(entries))
	}
	if got := loggedHashes(entries[:1]); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("first entry logged %v, want [1 2]", got)
	}
	got := loggedHashes(entries[1:])
	slices.Sort(got)
	if !slices.Equal(got, []uint64{3, 4, 5, 6}) {
		t.Fatalf("second entry logged %v, want 3, 4, 5, 6", got)
	}
}

// AppendFenced orders its entry with the session's decisions: under
// concurrent load, every track entry logged after the fenced entry holds no
// hash the fence refuses, and every request the fence refused got its error
// and logged nothing.
func TestAppendFencedOrdersWithDecisions(t *testing.T) {
	var fenced atomic.Bool
	errMoved := errors.New("moved")
	h := newHarness(t, nil, nil, func(c *Config) {
		c.Fence = func(tenant string, hashes []uint64) error {
			if fenced.Load() && tenant == "gone" {
				return errMoved
			}
			return nil
		}
	})
	if _, err := h.tr.AppendFenced(func() error { t.Fatal("fn ran without a session"); return nil }, nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("without a session: %v", err)
	}
	h.tr.SetLeader(true)
	h.waitReady()
	var wg sync.WaitGroup
	var refused atomic.Int64
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tenant := []string{"gone", "kept"}[w%2]
				_, err := h.tr.Track(context.Background(), tenant, []uint64{uint64(w)<<32 | i + 1})
				switch {
				case errors.Is(err, errMoved):
					refused.Add(1)
				case err != nil:
					t.Error(err)
					return
				}
			}
		}()
	}
	h.log.waitApplies(50)
	marker := fsm.AppendDropTenant(nil, testMinute, "marker")
	if _, err := h.tr.AppendFenced(func() error { fenced.Store(true); return nil }, marker); err != nil {
		t.Fatal(err)
	}
	h.log.mu.Lock()
	n := h.log.applies
	h.log.mu.Unlock()
	h.log.waitApplies(n + 50)
	close(stop)
	wg.Wait()
	entries, _ := h.log.snapshot()
	at := -1
	for i, e := range entries {
		if e.Type == fsm.EntryDropTenant && e.Tenant == "marker" {
			at = i
			continue
		}
		for _, th := range e.Tenants {
			if at >= 0 && th.Tenant == "gone" {
				t.Fatalf("entry %d, after the fenced entry %d, logs %d series of the fenced tenant", i, at, len(th.Hashes))
			}
		}
	}
	if at < 0 || refused.Load() == 0 {
		t.Fatalf("fenced entry at %d; %d requests refused by the fence", at, refused.Load())
	}
	if _, err := h.tr.AppendFenced(func() error { return errMoved }, marker); !errors.Is(err, errMoved) {
		t.Fatalf("fn's error: %v", err)
	}
}
