package partitionlimit

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// TestResendAfterNodeChange: once the accepting node changes (another
// incarnation answers a push), the next push carries every in-window minute
// sketch whole — sparse while it is mostly empty, dense beyond — not only
// what changed since the last push; the same incarnation again asks for
// nothing.
func TestResendAfterNodeChange(t *testing.T) {
	clk := newClock()
	l := newTestLimiter(t, clk, map[string]int64{"t": 1 << 40})
	sy := &syncer{l: l}
	r := rand.New(rand.NewPCG(5, 5))
	if err := l.Check("t", []Series{{Partition: 1, Hashes: hashes(r, 40)}, {Partition: 2, Hashes: hashes(r, 5000)}}); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Minute)
	if err := l.Check("t", []Series{{Partition: 1, Hashes: hashes(r, 30)}}); err != nil {
		t.Fatal(err)
	}
	ts, _ := l.tenant("t")
	sy.noteIncarnation("node-a-1")
	l.resendIfNeeded()
	if first := l.takeChanges(ts, l.minute()); first == nil || len(first.Sketches) != 3 {
		t.Fatalf("first push: %+v", first)
	}
	sy.noteIncarnation("node-a-1")
	l.resendIfNeeded()
	if again := l.takeChanges(ts, l.minute()); again != nil {
		t.Fatalf("same node, nothing changed, yet a push of %d sketches", len(again.Sketches))
	}

	sy.noteIncarnation("node-b-1")
	l.resendIfNeeded()
	req := l.takeChanges(ts, l.minute())
	if req == nil || len(req.Sketches) != 3 {
		t.Fatalf("resend: %+v", req)
	}
	for _, sk := range req.Sketches {
		if err := api.ValidateSketchRegisters(sk, l.p); err != nil {
			t.Fatal(err)
		}
		ms := &ts.parts[int32(sk.Partition)].minutes[sk.Minute%l.slots]
		got := make([]uint8, l.m)
		api.ForEachSketchRegister(sk, func(idx uint32, v uint8) { got[idx] = v })
		if !slices.Equal(got, ms.regs) {
			t.Fatalf("partition %d minute %d: resent registers differ from the sketch held", sk.Partition, sk.Minute)
		}
		if dense := sk.Partition == 2; dense != (len(sk.Dense) > 0) {
			t.Fatalf("partition %d: dense %v, sparse %d entries", sk.Partition, len(sk.Dense) > 0, len(sk.Sparse))
		}
	}
	if st := l.Stats(); st.Resends != 1 {
		t.Fatalf("resends %d, want 1", st.Resends)
	}
}

// TestSplitPush: a push above the size bound is cut into calls below it that
// hold every sketch once, in order.
func TestSplitPush(t *testing.T) {
	req := &api.PushSketchesRequest{Precision: 11}
	for i := range 10 {
		req.Sketches = append(req.Sketches, &api.Sketch{Tenant: "t", Partition: uint32(i), Dense: make([]byte, 2048)})
	}
	if parts := splitPush(req, 1<<20); len(parts) != 1 || parts[0] != req {
		t.Fatalf("small push split into %d", len(parts))
	}
	parts := splitPush(req, 5000)
	if len(parts) != 5 {
		t.Fatalf("split into %d parts, want 5 of 2 sketches", len(parts))
	}
	var all []*api.Sketch
	for _, p := range parts {
		if p.Precision != 11 || len(p.Sketches) == 0 {
			t.Fatalf("part %+v", p)
		}
		all = append(all, p.Sketches...)
	}
	if !slices.Equal(all, req.Sketches) {
		t.Fatal("parts do not hold every sketch once, in order")
	}
	// One sketch larger than the bound still goes (alone).
	if parts := splitPush(&api.PushSketchesRequest{Sketches: req.Sketches[:2]}, 100); len(parts) != 2 {
		t.Fatalf("oversized sketches: %d parts, want 2", len(parts))
	}
}
