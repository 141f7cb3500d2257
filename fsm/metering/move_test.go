package metering

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/metering/interval"
)

const moveP = 64

func newGroupReplica(t testing.TB, g int) *replica {
	t.Helper()
	m := New(g)
	lo, hi := layout.GroupSpan(g, moveP, 4) // created with 4 groups: 4–7 were raised
	m.SetHome(moveP, lo, hi)
	f, err := fsm.New(fsm.Config{Partitions: moveP, Groups: 8, Shards: 16, Group: g, Modules: []fsm.Module{m}})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{t: t, f: f, m: m}
}

// targetsIn returns n targets whose partition is p and one of another
// partition of the same group's home (created with 4 groups).
func targetsIn(p, n int) (in []Target, out Target) {
	lo, hi := layout.GroupSpan(layout.GroupOf(p, moveP, 4), moveP, 4)
	for i := 0; len(in) < n || out.Org == ""; i++ {
		t := Target{"org", "space", fmt.Sprintf("c%d", i), "postgres", "large", "inst"}
		switch q := layout.Partition(TargetHash(t), moveP); {
		case q == p:
			if len(in) < n {
				in = append(in, t)
			}
		case q >= lo && q < hi && out.Org == "":
			out = t
		}
	}
	return in, out
}

func usageIDs(m *Module) map[string]bool {
	ids := map[string]bool{}
	for _, s := range m.Spans() {
		if s.Planned != nil {
			ids[s.UsageID(m.group)] = true
		}
	}
	return ids
}

// TestMovePartitionMetering gives one partition's metering from group 1 to
// group 5 and checks what the design needs: the spans move (a planned
// interval keeps its usage id), retries of events accepted by the giver are
// duplicates in the receiver (ids from before the switch too), the giver
// answers Moved for the partition and nothing else, both sides survive a
// snapshot, and giving the partition back lifts the fence.
func TestMovePartitionMetering(t *testing.T) {
	const p = 20 // group 1's home is [16, 32)
	h := int64(3_600_000)
	now := int64(1_700_000_000_000) / h * h
	in, out := targetsIn(p, 3)
	src, dst := newGroupReplica(t, 1), newGroupReplica(t, 5)

	// Before the switch: its dedup record is unknown, copied by every give.
	if r := src.events(now, start("old-start", in[0], now)); r[0].Code != Created {
		t.Fatal(r)
	}
	if !src.apply(EntryTargets, EncodeTargets()).(bool) || !src.m.Hashes() {
		t.Fatal("the switch did not turn hashes on")
	}
	if src.apply(EntryTargets, EncodeTargets()).(bool) {
		t.Fatal("a second switch reported a change")
	}
	for i, tg := range []Target{in[1], in[2], out} {
		if r := src.events(now, start(fmt.Sprint("s", i), tg, now)); r[0].Code != Created {
			t.Fatal(r)
		}
	}
	if r := src.events(now+1, stop("stop-2", in[2], now+h/2)); r[0].Code != Created {
		t.Fatal(r)
	}
	// Plan (not execute) the intervals due: the sink may have them already.
	grid := interval.Grid{G: interval.Hour}
	work, _ := src.m.Due(grid, now+2*h, 64, nil)
	var plans []PlanItem
	for _, w := range work {
		if w.Plan != nil {
			plans = append(plans, *w.Plan)
		}
	}
	src.apply(EntryPlan, EncodePlan(now+2*h, plans))
	before := usageIDs(src.m)
	if len(before) < 3 {
		t.Fatalf("planned usage ids %v", before)
	}
	// A group a raise added holds no partition's metering until it receives
	// one; this one first receives partition 3 from group 0, so the spans
	// moved below get other ids than they had.
	dst.apply(EntryTargets, EncodeTargets())
	if r := dst.events(now, start("early", in[1], now)); r[0].Code != Moved {
		t.Fatalf("a raised group before any receive: %+v", r[0])
	}
	g0 := newGroupReplica(t, 0)
	in3, _ := targetsIn(3, 2)
	g0.events(now, start("g0-a", in3[0], now), start("g0-b", in3[1], now))
	first, _, err := g0.m.TakePartition(3)
	if err != nil {
		t.Fatal(err)
	}
	tr0, err := DecodeTransfer(first)
	if err != nil {
		t.Fatal(err)
	}
	if res := dst.m.PutPartition(tr0); res.Spans != 2 || !dst.m.Owns(3) || dst.m.Owns(p) {
		t.Fatalf("first put: %+v", res)
	}

	payload, took, err := src.m.TakePartition(p)
	if err != nil || took.Spans != 3 || took.Dedup != 4 {
		t.Fatalf("take: %+v %v (want 3 spans, 3 ids of p and 1 from before the switch)", took, err)
	}
	for _, s := range src.m.Spans() {
		if layout.Partition(TargetHash(s.Target), moveP) == p {
			t.Fatalf("span %d of partition %d left in the giver", s.ID, p)
		}
	}
	for name, ev := range map[string]Event{"retry": start("s0", in[1], now), "new": start("n", in[2], now+h), "stop": stop("x", in[1], now+h)} {
		if r := src.events(now+2*h, ev); r[0].Code != Moved || r[0].Reason == "" {
			t.Fatalf("giver, %s event of the moved partition: %+v", name, r[0])
		}
	}
	if r := src.events(now+2*h, stop("stop-out", out, now+h)); r[0].Code != Created {
		t.Fatalf("giver, another partition: %+v", r[0])
	}
	if again, res, err := src.m.TakePartition(p); err != nil || res.Spans != 0 || res.Dedup != 0 || len(again) == 0 {
		t.Fatalf("a second take: %+v %v", res, err)
	}

	tr, err := DecodeTransfer(payload)
	if err != nil {
		t.Fatal(err)
	}
	if res := dst.m.PutPartition(tr); res.Refused != "" || res.Spans != 3 {
		t.Fatalf("put: %+v", res)
	}
	after := usageIDs(dst.m)
	for id := range before {
		if _, ok := after[id]; !ok && !usageIDs(src.m)[id] {
			t.Fatalf("usage id %s lost by the move (receiver has %v)", id, after)
		}
	}
	for _, s := range dst.m.Spans() {
		if s.Target == in[1] && (s.OriginGroup != 1 || s.OriginSpan == 0 || s.ID == s.OriginSpan) {
			t.Fatalf("moved span %+v: origin not kept or id not renumbered", s)
		}
	}
	for _, c := range []struct {
		name string
		ev   Event
		want Code
	}{
		{"retried start", start("s0", in[1], now), Duplicate},
		{"retried stop", stop("stop-2", in[2], now+h/2), Duplicate},
		{"retry from before the switch", start("old-start", in[0], now), Duplicate},
		{"second start, open span", start("z", in[1], now+h), Conflict},
		{"stop of a moved open span", stop("stop-1", in[1], now+h), Created},
	} {
		if r := dst.events(now+2*h, c.ev); r[0].Code != c.want {
			t.Fatalf("receiver, %s: %+v, want %d", c.name, r[0], c.want)
		}
	}

	// Both sides through a snapshot: the fence, the origins and the hashes.
	for _, r := range []*replica{src, dst} {
		fresh := newGroupReplica(t, r.m.group)
		fresh.restoreFrom(r.snapshot())
		if !bytes.Equal(fresh.snapshot(), r.snapshot()) {
			t.Fatalf("group %d: a restored snapshot differs", r.m.group)
		}
		if fresh.m.Owns(p) != (r == dst) || !fresh.m.Hashes() {
			t.Fatalf("group %d after a restore: owns %v, hashes %v", r.m.group, fresh.m.Owns(p), fresh.m.Hashes())
		}
		if got, want := usageIDs(fresh.m), usageIDs(r.m); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("group %d: usage ids %v after a restore, %v before", r.m.group, got, want)
		}
	}

	// Given back: the fence is lifted and the events are the giver's again.
	back, _, err := dst.m.TakePartition(p)
	if err != nil {
		t.Fatal(err)
	}
	tr, err = DecodeTransfer(back)
	if err != nil {
		t.Fatal(err)
	}
	if res := src.m.PutPartition(tr); res.Refused != "" {
		t.Fatal(res.Refused)
	}
	if !src.m.Owns(p) || dst.m.Owns(p) {
		t.Fatal("the fence did not follow the partition back")
	}
	if r := src.events(now+2*h, start("s0", in[1], now)); r[0].Code != Duplicate {
		t.Fatalf("back in the giver, a retry: %+v", r[0])
	}
	found := false
	for _, s := range src.m.Spans() {
		if s.Target == in[2] {
			found = true
			if !before[s.UsageID(1)] {
				t.Fatalf("the span back home plans %s, not its interval planned before the moves (%v)", s.UsageID(1), before)
			}
		}
	}
	if !found {
		t.Fatal("the stopped span did not come back")
	}
}

// Replicas that reached the same index by different paths (one applied the
// events, one restored a snapshot written before the switch) give the same
// transfer: the records from before the switch are unknown on both.
func TestTakeIsTheSameOnEveryReplica(t *testing.T) {
	const p = 35 // group 2's home is [32, 48)
	now := int64(1_700_000_000_000)
	in, out := targetsIn(p, 2)
	a, b := newGroupReplica(t, 2), newGroupReplica(t, 2)
	a.events(now, start("a1", in[0], now), start("a2", out, now))
	b.restoreFrom(a.snapshot())
	if a.m.v2() {
		t.Fatal("a section before the switch is written at version 2")
	}
	for _, r := range []*replica{a, b} {
		r.apply(EntryTargets, EncodeTargets())
		r.events(now, start("a3", in[1], now))
	}
	pa, ra, errA := a.m.TakePartition(p)
	pb, rb, errB := b.m.TakePartition(p)
	if errA != nil || errB != nil || !bytes.Equal(pa, pb) || ra != rb {
		t.Fatalf("transfers differ: %+v %+v %v %v", ra, rb, errA, errB)
	}
	if ra.Dedup != 3 { // a1, a2 (unknown) and a3
		t.Fatalf("take %+v", ra)
	}
	if !bytes.Equal(a.snapshot(), b.snapshot()) {
		t.Fatal("the replicas' sections differ after the take")
	}
}

func TestTransferRefusals(t *testing.T) {
	const p = 21
	now := int64(1_700_000_000_000)
	in, _ := targetsIn(p, 1)
	src := newGroupReplica(t, 1)
	src.apply(EntryTargets, EncodeTargets())
	src.events(now, start("s", in[0], now))
	good, _, err := src.m.TakePartition(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) - 1 {
		if _, err := DecodeTransfer(good[:i]); !errors.Is(err, ErrBadPayload) {
			t.Fatalf("truncated at %d: %v", i, err)
		}
	}
	if _, _, err := src.m.TakePartition(moveP); err == nil {
		t.Fatal("a take of a partition out of range was accepted")
	}
	// The receiver already has an open span for the moved target (a group
	// of the created count, whose home holds the partition too).
	tr, _ := DecodeTransfer(good)
	dst := newGroupReplica(t, 1)
	dst.events(now, start("d", in[0], now))
	if res := dst.m.PutPartition(tr); res.Refused == "" || len(dst.m.Spans()) != 1 {
		t.Fatalf("conflicting put: %+v", res)
	}
	// A span of another partition in the payload is refused.
	other := newGroupReplica(t, 1)
	out, _ := targetsIn(22, 1)
	other.events(now, start("o", out[0], now))
	bad, res, _ := other.m.TakePartition(22)
	if res.Spans != 1 {
		t.Fatalf("take %+v", res)
	}
	bad[2] = byte(p) // relabel the partition: its span no longer belongs
	if _, err := DecodeTransfer(bad); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("relabelled transfer: %v", err)
	}
}

// A partition whose series a build without metering moves handed from its
// first group to a raised one keeps its metering in the first group: a later
// give by the raised group moves nothing, and the receiver does not start
// holding it.
func TestSeriesOnlyMoveLeavesMeteringHome(t *testing.T) {
	const p = 20
	now := int64(1_700_000_000_000)
	in, _ := targetsIn(p, 1)
	home, d, e := newGroupReplica(t, 1), newGroupReplica(t, 5), newGroupReplica(t, 6)
	payload, res, err := d.m.TakePartition(p)
	if err != nil || res != (TakeResult{}) {
		t.Fatalf("take from a group without the metering: %+v %v", res, err)
	}
	tr, err := DecodeTransfer(payload)
	if err != nil || tr.Held {
		t.Fatalf("transfer %+v %v", tr, err)
	}
	e.m.PutPartition(tr)
	if e.m.Owns(p) || d.m.Owns(p) || !home.m.Owns(p) {
		t.Fatalf("owners after an empty move: home %v, giver %v, receiver %v", home.m.Owns(p), d.m.Owns(p), e.m.Owns(p))
	}
	if r := e.events(now, start("x", in[0], now)); r[0].Code != Moved {
		t.Fatalf("receiver of an empty move: %+v", r[0])
	}
	if r := home.events(now, start("x", in[0], now)); r[0].Code != Created {
		t.Fatalf("home group: %+v", r[0])
	}
	// A payload claiming spans of metering it did not hold is refused.
	bad := append([]byte(nil), payload...)
	bad[len(bad)-2] = 1 // span count
	if _, err := DecodeTransfer(bad); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("spans without held: %v", err)
	}
}

// TargetHash is FNV-1a 64 over each field followed by 0x1f, as the package
// documentation says (computed inline).
func TestTargetHashIsFNV1a(t *testing.T) {
	for _, tg := range []Target{{}, tg, {Org: "ö", Space: "\x1f", Instance: "long-" + string(make([]byte, 300))}} {
		h := fnv.New64a()
		for _, s := range tg.Fields() {
			h.Write([]byte(s))
			h.Write([]byte{0x1f})
		}
		if got, want := TargetHash(tg), h.Sum64(); got != want {
			t.Fatalf("TargetHash(%q) = %#x, FNV-1a gives %#x", tg, got, want)
		}
	}
}
