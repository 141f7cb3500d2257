package partitionlimit

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// fakeClock is a settable wall clock.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration)     { c.ns.Add(int64(d)) }
func limitsOf(m map[string]int64) LimitsFunc { return func(t string) int64 { return m[t] } }

func hashes(r *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

func newTestLimiter(t *testing.T, clk *fakeClock, limits map[string]int64) *Limiter {
	t.Helper()
	l, err := New(Config{Limits: limitsOf(limits), Clock: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestPrecisionRange(t *testing.T) {
	for _, p := range []int{-1, 1, 3, 19, 64} {
		if _, err := New(Config{Precision: p}); err == nil {
			t.Errorf("precision %d accepted", p)
		}
	}
	for _, p := range []int{0, 4, 11, 14, 18} {
		l, err := New(Config{Precision: p})
		if err != nil {
			t.Errorf("precision %d: %v", p, err)
			continue
		}
		_ = l.Close()
	}
	if _, err := New(Config{WindowMinutes: -3}); err == nil {
		t.Error("negative window accepted")
	}
}

// TestCheckRejectsWholeRequest: a request pushing one partition over its limit
// is rejected with a LimitError naming tenant, partition, limit and estimate,
// and changes no partition, not even those within their limit.
func TestCheckRejectsWholeRequest(t *testing.T) {
	clk := newClock()
	l := newTestLimiter(t, clk, map[string]int64{"t1": 1000})
	r := rand.New(rand.NewPCG(1, 1))
	if err := l.Check("t1", []Series{{Partition: 3, Hashes: hashes(r, 800)}, {Partition: 5, Hashes: hashes(r, 100)}}); err != nil {
		t.Fatalf("800 series under a 1000 limit: %v", err)
	}
	before3, before5 := l.WindowRegisters("t1", 3), l.WindowRegisters("t1", 5)
	err := l.Check("t1", []Series{{Partition: 5, Hashes: hashes(r, 100)}, {Partition: 3, Hashes: hashes(r, 400)}})
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("1200 series under a 1000 limit: err = %v", err)
	}
	if le.Tenant != "t1" || le.Partition != 3 || le.Limit != 1000 || le.Estimate < 1100 || le.Estimate > 1300 {
		t.Fatalf("limit error %+v", le)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("gRPC code %v, want ResourceExhausted", status.Code(err))
	}
	if !slices.Equal(before3, l.WindowRegisters("t1", 3)) || !slices.Equal(before5, l.WindowRegisters("t1", 5)) {
		t.Fatal("a rejected request changed the sketches")
	}
	if e := l.Estimate("t1", 3); math.Abs(e-800) > 80 {
		t.Fatalf("estimate after rejection %v, want ~800", e)
	}
	// Series already counted pass even at the limit: only new ones add.
	if err := l.Check("t1", []Series{{Partition: 9, Hashes: hashes(r, 990)}}); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Rejected[ReasonLimit] != 1 || st.Accepted != 2 || st.Checks != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCheckInvalidAndUnlimited(t *testing.T) {
	l := newTestLimiter(t, newClock(), map[string]int64{"t1": 10, "bad/id": 10})
	if err := l.Check("free", []Series{{Partition: 1, Hashes: []uint64{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Tenants != 0 || st.Unlimited != 1 {
		t.Fatalf("unlimited tenant tracked: %+v", st)
	}
	for _, req := range [][]Series{{{Partition: -1}}, {{Partition: DefaultPartitions}}} {
		if err := l.Check("t1", req); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("partition %d: err = %v", req[0].Partition, err)
		}
	}
	if err := l.Check("bad/id", []Series{{Partition: 1, Hashes: []uint64{1}}}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("bad tenant id: err = %v", err)
	}
	if st := l.Stats(); st.Rejected[ReasonInvalid] != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSlidingWindow: series count for WindowMinutes minutes after they were
// last sent; a series sent again stays in the window.
func TestSlidingWindow(t *testing.T) {
	clk := newClock()
	l := newTestLimiter(t, clk, map[string]int64{"t": 1 << 40})
	r := rand.New(rand.NewPCG(2, 2))
	a, b := hashes(r, 500), hashes(r, 500)
	if err := l.Check("t", []Series{{Partition: 0, Hashes: a}}); err != nil {
		t.Fatal(err)
	}
	clk.add(10 * time.Minute)
	if err := l.Check("t", []Series{{Partition: 0, Hashes: append(slices.Clone(a[:250]), b...)}}); err != nil {
		t.Fatal(err)
	}
	if e := l.Estimate("t", 0); math.Abs(e-1000) > 70 {
		t.Fatalf("minute 10: estimate %v, want ~1000", e)
	}
	clk.add(10 * time.Minute) // minute 20: minute 0 left the window
	if e := l.Estimate("t", 0); math.Abs(e-750) > 60 {
		t.Fatalf("minute 20: estimate %v, want ~750", e)
	}
	l.Rotate()
	clk.add(10 * time.Minute) // minute 30: everything left
	if e := l.Estimate("t", 0); e != 0 {
		t.Fatalf("minute 30: estimate %v, want 0", e)
	}
}

// TestConcurrentChecks: parallel Checks of one tenant never exceed the limit
// by more than the estimator's error (run with -race).
func TestConcurrentChecks(t *testing.T) {
	l := newTestLimiter(t, newClock(), map[string]int64{"t": 5000})
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 3))
			for range 50 {
				if l.Check("t", []Series{{Partition: 1, Hashes: hashes(r, 100)}}) == nil {
					accepted.Add(100)
				}
			}
		}()
	}
	wg.Wait()
	if a := accepted.Load(); a < 4500 || a > 5500 {
		t.Fatalf("accepted %d series under a limit of 5000", a)
	}
}

// TestTakeAndRestoreChanges: a push carries the registers raised since the
// previous one (sparse), a failed push is re-sent, and many changes go dense.
func TestTakeAndRestoreChanges(t *testing.T) {
	clk := newClock()
	l := newTestLimiter(t, clk, map[string]int64{"t": 1 << 40})
	r := rand.New(rand.NewPCG(4, 4))
	now := l.minute()
	if err := l.Check("t", []Series{{Partition: 2, Hashes: hashes(r, 50)}}); err != nil {
		t.Fatal(err)
	}
	ts, _ := l.tenant("t")
	req := l.takeChanges(ts, now)
	if req == nil || len(req.Sketches) != 1 || len(req.Sketches[0].Sparse) == 0 || req.Sketches[0].Minute != now {
		t.Fatalf("push %+v", req)
	}
	if err := api.ValidateSketchRegisters(req.Sketches[0], l.p); err != nil {
		t.Fatal(err)
	}
	if again := l.takeChanges(ts, now); again != nil {
		t.Fatalf("nothing changed, yet a push: %+v", again)
	}
	l.restoreChanges(ts, req)
	if again := l.takeChanges(ts, now); again == nil || !slices.Equal(again.Sketches[0].Sparse, req.Sketches[0].Sparse) {
		t.Fatalf("restored push %+v, want %+v", again, req)
	}
	if err := l.Check("t", []Series{{Partition: 2, Hashes: hashes(r, 5000)}}); err != nil {
		t.Fatal(err)
	}
	if d := l.takeChanges(ts, now); d == nil || len(d.Sketches[0].Dense) != int(l.m) {
		t.Fatalf("5000 new series: want a dense push, got %+v", d)
	}
}

// TestMergeRemote: received sketches raise the window like local series, and
// only inside the window.
func TestMergeRemote(t *testing.T) {
	clk := newClock()
	l := newTestLimiter(t, clk, map[string]int64{"t": 1 << 40})
	r := rand.New(rand.NewPCG(5, 5))
	src := newTestLimiter(t, clk, map[string]int64{"t": 1 << 40})
	if err := src.Check("t", []Series{{Partition: 7, Hashes: hashes(r, 3000)}}); err != nil {
		t.Fatal(err)
	}
	ts, _ := src.tenant("t")
	req := src.takeChanges(ts, src.minute())
	old := &api.Sketch{Tenant: "t", Partition: 7, Minute: l.minute() - 20, Sparse: []uint32{api.HLLSparseEntry(1, 30)}}
	l.applyBatch(&api.SketchBatch{Precision: 11, Sketches: append(req.Sketches, old, &api.Sketch{Tenant: "t", Partition: 7, Minute: l.minute(), Dense: []byte{1}})})
	if !slices.Equal(l.WindowRegisters("t", 7), src.WindowRegisters("t", 7)) {
		t.Fatal("received registers differ from the sender's")
	}
	if st := l.Stats(); st.BadReceived != 1 || st.SketchesReceived != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCheckSteadyStateAllocs: once a tenant's partitions exist, Check does
// not allocate.
func TestCheckSteadyStateAllocs(t *testing.T) {
	l := newTestLimiter(t, newClock(), map[string]int64{"t": 1 << 40})
	req := benchRequest(rand.New(rand.NewPCG(6, 6)), 1000, 16)
	if err := l.Check("t", req); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() { _ = l.Check("t", req) }); a != 0 {
		t.Fatalf("%v allocations per Check", a)
	}
}
