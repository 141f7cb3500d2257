package partitionlimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 23, 10, 0, 30, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

func newHub(t *testing.T, clk *clock, mod func(*Config)) *Hub {
	t.Helper()
	cfg := Config{NodeID: "n1", Clock: clk.now, TenantKnown: func(t string) bool { return t != "stranger" }}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// sketchOf builds a sketch of n random series (sparse unless dense).
func sketchOf(r *rand.Rand, tenant string, part uint32, minute int64, n int, p uint8, dense bool) *api.Sketch {
	regs := make([]uint8, 1<<p)
	for range n {
		i, v := api.HLLPos(api.MixHash(r.Uint64()), p)
		regs[i] = max(regs[i], v)
	}
	s := &api.Sketch{Tenant: tenant, Partition: part, Minute: minute}
	if dense {
		s.Dense = regs
		return s
	}
	for i, v := range regs {
		if v != 0 {
			s.Sparse = append(s.Sparse, api.HLLSparseEntry(uint32(i), v))
		}
	}
	return s
}

// TestBadPushChangesNothing: each kind of bad input is refused with
// ErrInvalid (InvalidArgument), and a push with one bad sketch among good
// ones changes nothing at all.
func TestBadPushChangesNothing(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, nil)
	r := rand.New(rand.NewPCG(1, 1))
	now := clk.now().Unix() / 60
	good := sketchOf(r, "t1", 3, now, 100, 11, false)
	if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{good}}); err != nil {
		t.Fatal(err)
	}
	before, regsBefore := h.Estimate("t1", 3)
	dense := sketchOf(r, "t1", 3, now, 500, 11, true)
	bad := map[string]*api.PushSketchesRequest{
		"wrong precision":     {Precision: 14, Sketches: []*api.Sketch{dense}},
		"truncated registers": {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: 3, Minute: now, Dense: dense.Dense[:1000]}}},
		"minute too old":      {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: 3, Minute: now - 21, Sparse: []uint32{api.HLLSparseEntry(1, 9)}}}},
		"minute in future":    {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: 3, Minute: now + 2, Sparse: []uint32{api.HLLSparseEntry(1, 9)}}}},
		"unknown tenant":      {Precision: 11, Sketches: []*api.Sketch{{Tenant: "stranger", Partition: 3, Minute: now, Sparse: []uint32{api.HLLSparseEntry(1, 9)}}}},
		"invalid tenant":      {Precision: 11, Sketches: []*api.Sketch{{Tenant: "a/b", Partition: 3, Minute: now, Sparse: []uint32{api.HLLSparseEntry(1, 9)}}}},
		"partition range":     {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: DefaultPartitions, Minute: now, Sparse: []uint32{api.HLLSparseEntry(1, 9)}}}},
		"register too large":  {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: 3, Minute: now, Sparse: []uint32{api.HLLSparseEntry(1, 60)}}}},
		"good then bad":       {Precision: 11, Sketches: []*api.Sketch{dense, {Tenant: "t1", Partition: 4, Minute: now, Dense: []byte{1, 2}}}},
	}
	for name, req := range bad {
		_, err := h.Merge(req)
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, api.ErrInvalidSketch) {
			t.Errorf("%s: err = %v", name, err)
		}
		if code := status.Code(Status(err)); code != codes.InvalidArgument {
			t.Errorf("%s: gRPC code %v, want InvalidArgument", name, code)
		}
	}
	after, regsAfter := h.Estimate("t1", 3)
	if after != before || !slices.Equal(regsBefore, regsAfter) || h.Stats().Sketches != 1 {
		t.Fatalf("refused pushes changed the state: %v → %v, %d sketches", before, after, h.Stats().Sketches)
	}
	if st := h.Stats(); st.RejectedInvalid != uint64(len(bad)) {
		t.Fatalf("rejected %d, want %d", st.RejectedInvalid, len(bad))
	}
}

// TestCapacity: beyond MaxSketches a push that adds sketches is refused
// whole; merges into existing sketches go on; expiry frees room.
func TestCapacity(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, func(c *Config) { c.MaxSketches = 2 })
	now := clk.now().Unix() / 60
	one := func(part uint32, min int64) *api.Sketch {
		return &api.Sketch{Tenant: "t", Partition: part, Minute: min, Sparse: []uint32{api.HLLSparseEntry(part, 5)}}
	}
	if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{one(1, now-19), one(2, now)}}); err != nil {
		t.Fatal(err)
	}
	_, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{one(2, now), one(3, now)}})
	if !errors.Is(err, ErrFull) {
		t.Fatalf("third sketch: err = %v", err)
	}
	if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{one(2, now)}}); err != nil {
		t.Fatalf("merge into an existing sketch at capacity: %v", err)
	}
	clk.add(time.Minute) // minute now-19 leaves the window
	if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{one(3, now)}}); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if st := h.Stats(); st.Sketches != 2 || st.RejectedFull != 1 || st.Expired != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSparseDenseMerge: merging sparse and dense sketches in any order gives
// the register-wise maximum, and a sketch turns dense past m/4 entries.
func TestSparseDenseMerge(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, nil)
	now := clk.now().Unix() / 60
	r := rand.New(rand.NewPCG(2, 2))
	want := make([]uint8, 2048)
	for i, n := range []int{10, 50, 200, 800, 20} {
		s := sketchOf(r, "t", 0, now, n, 11, i == 3)
		api.ForEachSketchRegister(s, func(idx uint32, v uint8) { want[idx] = max(want[idx], v) })
		if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{s}}); err != nil {
			t.Fatal(err)
		}
		if _, got := h.Estimate("t", 0); !slices.Equal(got, want) {
			t.Fatalf("after merge %d: registers differ from the maximum", i)
		}
		if i == 1 && h.Stats().SparseSketches != 1 {
			t.Fatal("60 series: sketch not sparse")
		}
	}
	if h.Stats().SparseSketches != 0 {
		t.Fatal("after a dense merge: still sparse")
	}
	// Merging the same sketch again changes nothing (idempotent).
	if n, _ := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{{Tenant: "t", Partition: 0, Minute: now, Dense: want}}}); n != 0 {
		t.Fatalf("re-merge reported %d changed", n)
	}
}

// TestCursorDeltas: a cursor returns everything first, then only what
// changed, and skips what its own origin pushed.
func TestCursorDeltas(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, nil)
	now := clk.now().Unix() / 60
	r := rand.New(rand.NewPCG(3, 3))
	push := func(origin string, ss ...*api.Sketch) {
		if _, err := h.Merge(&api.PushSketchesRequest{Precision: 11, Sketches: ss, Origin: origin}); err != nil {
			t.Fatal(err)
		}
	}
	push("", sketchOf(r, "t", 1, now, 10, 11, false), sketchOf(r, "t", 2, now, 10, 11, false))
	c := h.NewCursor("peer-b", true)
	defer c.Close()
	if got := c.Take(0); len(got) != 2 {
		t.Fatalf("first take: %d sketches, want 2", len(got))
	}
	if got := c.Take(0); len(got) != 0 {
		t.Fatalf("nothing changed: %d sketches", len(got))
	}
	push("peer-b", sketchOf(r, "t", 1, now, 10, 11, false))
	if got := c.Take(0); len(got) != 0 {
		t.Fatalf("peer-b's own push came back to it: %d sketches", len(got))
	}
	push("", sketchOf(r, "t", 2, now, 10, 11, false))
	select {
	case <-c.C():
	default:
		t.Fatal("no signal after a change")
	}
	got := c.Take(0)
	if len(got) != 1 || got[0].Partition != 2 {
		t.Fatalf("delta %+v, want partition 2 only", got)
	}
}

// TestClientCannotClaimOrigin: a push through the service whose origin
// names a peer, from a caller the node does not know as a node (Origin
// says so), reaches that peer's cursor: a client once kept its sketches
// from a peer by claiming the peer's id. A node's claim stands.
func TestClientCannotClaimOrigin(t *testing.T) {
	clk := newClock()
	h := newHub(t, clk, nil)
	now := clk.now().Unix() / 60
	r := rand.New(rand.NewPCG(4, 4))
	svc := NewService(h, nil)
	isNode := false
	svc.Origin = func(_ context.Context, claimed string) string {
		if isNode {
			return claimed
		}
		return ""
	}
	c := h.NewCursor("peer-b", true)
	defer c.Close()
	c.Take(0)
	push := func(part uint32) {
		req := &api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{sketchOf(r, "t", part, now, 10, 11, false)}, Origin: "peer-b"}
		if _, err := svc.PushSketches(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	push(1)
	if got := c.Take(0); len(got) != 1 {
		t.Fatalf("a client's push claiming peer-b's origin: %d sketches reach peer-b, want 1", len(got))
	}
	isNode = true
	push(2)
	if got := c.Take(0); len(got) != 0 {
		t.Fatalf("peer-b's own push came back to it: %d sketches", len(got))
	}
}
