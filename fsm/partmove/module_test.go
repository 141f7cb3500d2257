package partmove

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/fsm/shares"
	"github.com/tollgate-io/tollgate/layout"
)

const (
	testP    = 16
	testBase = 2 // groups 0 and 1 own partitions; group 2 was added by a raise
	testG    = 3
)

type group struct {
	f   *fsm.FSM
	m   *Module
	sh  *shares.Module
	mt  *fsmmeter.Module
	idx uint64
}

func newGroup(t testing.TB, g int) *group {
	t.Helper()
	sh, err := shares.New(g, testG)
	if err != nil {
		t.Fatal(err)
	}
	m := New(g, testP, testBase)
	mt := fsmmeter.New(g)
	lo, hi := layout.GroupSpan(g, testP, testBase)
	mt.SetHome(testP, lo, hi)
	f, err := fsm.New(fsm.Config{Partitions: testP, Groups: testG, Shards: 4, Group: g, Base: testBase, Modules: []fsm.Module{sh, mt, m}})
	if err != nil {
		t.Fatal(err)
	}
	m.Bind(f, sh, mt)
	return &group{f: f, m: m, sh: sh, mt: mt}
}

func (g *group) apply(t testing.TB, data []byte) any {
	t.Helper()
	g.idx++
	res := g.f.Apply(&raft.Log{Index: g.idx, Term: 1, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); ok {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func (g *group) mod(t testing.TB, typ byte, payload []byte) any {
	t.Helper()
	data, err := fsm.AppendModuleEntry(nil, typ, 1000, payload)
	if err != nil {
		t.Fatal(err)
	}
	return g.apply(t, data)
}

// hashesIn returns n distinct hashes of partition p.
func hashesIn(rng *rand.Rand, p, n int) []uint64 {
	first, last := layout.PartitionHashRange(p, testP)
	seen := map[uint64]bool{}
	var out []uint64
	for len(out) < n {
		h := first + rng.Uint64N(last-first+1)
		if h != 0 && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

func (g *group) track(t testing.TB, now int64, tenant string, hs []uint64) {
	t.Helper()
	g.apply(t, fsm.AppendTrack(nil, now, []fsm.TenantHashes{{Tenant: tenant, Hashes: hs, New: len(hs)}}))
}

func present(f *fsm.FSM, tenant string, hs []uint64, now int64) int {
	out := make([]uint8, len(hs))
	f.Lookup(tenant, hs, now, 21, out)
	n := 0
	for _, s := range out {
		if s != fsm.StateAbsent {
			n++
		}
	}
	return n
}

// A give takes the partition's series (and only those) with their share; a
// receive installs them once; a complete forgets the outbox copy; a
// re-proposed give and a re-delivered receive change nothing.
func TestHandOffLifecycle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src, dst := newGroup(t, 0), newGroup(t, 2)
	const p, other = 3, 5 // both owned by group 0 (partitions 0..7)
	if !src.m.Owns(p) || dst.m.Owns(p) || dst.m.Owns(0) {
		t.Fatal("initial ownership is not the arithmetic of the base count")
	}
	a, b, c := hashesIn(rng, p, 300), hashesIn(rng, p, 40), hashesIn(rng, other, 100)
	src.track(t, 1000, "a", a)
	src.track(t, 1001, "b", b)
	src.track(t, 1001, "a", c)
	if got := src.f.TenantActive("a"); got != 400 {
		t.Fatalf("a holds %d", got)
	}

	gr := src.mod(t, EntryGive, AppendGive(nil, Give{Nonce: 7, Partition: p, To: 2})).(GiveResult)
	if gr.Refused != "" || gr.Series != 340 {
		t.Fatalf("give: %+v", gr)
	}
	if src.m.Owns(p) || !src.m.Owns(other) {
		t.Fatal("ownership after give")
	}
	if a, b := src.f.TenantActive("a"), src.f.TenantActive("b"); a != 100 || b != 0 {
		t.Fatalf("after give: a %d b %d active in the giver", a, b)
	}
	if n := present(src.f, "a", a, 1001); n != 0 {
		t.Fatalf("%d given series still in the giver", n)
	}
	if n := present(src.f, "a", c, 1001); n != 100 {
		t.Fatalf("other partition: %d of 100 left", n)
	}
	if d, _ := src.sh.Delta("a"); d != -300 {
		t.Fatalf("giver share delta of a: %d", d)
	}
	// Re-proposed: nothing changes; another partition not owned: refused.
	if r := src.mod(t, EntryGive, AppendGive(nil, Give{Nonce: 7, Partition: p, To: 2})).(GiveResult); !r.Already {
		t.Fatalf("re-proposed give: %+v", r)
	}
	if r := src.mod(t, EntryGive, AppendGive(nil, Give{Nonce: 8, Partition: 12, To: 2})).(GiveResult); r.Refused == "" {
		t.Fatalf("give of a partition not owned: %+v", r)
	}
	tr := src.m.Outbox(7)
	if tr == nil {
		t.Fatal("no outbox copy")
	}
	for range 2 { // the second delivery is a duplicate
		dst.mod(t, EntryReceive, tr)
	}
	if a, b := dst.f.TenantActive("a"), dst.f.TenantActive("b"); a != 300 || b != 40 {
		t.Fatalf("receiver holds a %d b %d", a, b)
	}
	if n := present(dst.f, "a", a, 1001); n != 300 {
		t.Fatalf("receiver finds %d of 300", n)
	}
	if d, _ := dst.sh.Delta("b"); d != 40 {
		t.Fatalf("receiver share delta of b: %d", d)
	}
	if !dst.m.Owns(p) || !dst.m.Received(7) {
		t.Fatal("receiver does not own the partition")
	}
	if dst.f.Now() < 1001 {
		t.Fatalf("receiver clock %d behind the giver's", dst.f.Now())
	}
	if r := src.mod(t, EntryComplete, AppendComplete(nil, 7)).(CompleteResult); !r.Found || src.m.Outbox(7) != nil {
		t.Fatal("complete")
	}
	if r := src.mod(t, EntryComplete, AppendComplete(nil, 7)).(CompleteResult); r.Found {
		t.Fatal("second complete found the transfer")
	}
}

func snapshot(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A snapshot taken between give and complete restores the ownership, the
// outbox and the received nonces; a corrupt section is refused.
func TestSnapshotRestore(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src, dst := newGroup(t, 1), newGroup(t, 2)
	src.track(t, 500, "t", hashesIn(rng, 10, 50))
	src.mod(t, EntryGive, AppendGive(nil, Give{Nonce: 1, Partition: 10, To: 2}))
	dst.mod(t, EntryReceive, src.m.Outbox(1))

	for _, g := range []*group{src, dst} {
		b := snapshot(t, g.f)
		r := newGroup(t, g.m.group)
		if err := r.f.Restore(nopCloser{bytes.NewReader(b)}); err != nil {
			t.Fatal(err)
		}
		for p := range testP {
			if r.m.Owns(p) != g.m.Owns(p) {
				t.Fatalf("group %d partition %d: owned %v after restore, %v before", g.m.group, p, r.m.Owns(p), g.m.Owns(p))
			}
		}
		if !bytes.Equal(r.m.Outbox(1), g.m.Outbox(1)) || r.m.Received(1) != g.m.Received(1) {
			t.Fatalf("group %d: outbox or received nonces differ after restore", g.m.group)
		}
		if r.f.TenantActive("t") != g.f.TenantActive("t") {
			t.Fatal("series differ after restore")
		}
	}
	// A group that never moved writes no section and restores to its range.
	fresh := newGroup(t, 0)
	r := newGroup(t, 0)
	if err := r.f.Restore(nopCloser{bytes.NewReader(snapshot(t, fresh.f))}); err != nil || !r.m.Owns(0) || r.m.Owns(8) {
		t.Fatalf("fresh restore: %v", err)
	}
	if _, err := src.m.PrepareRestore([]byte{1, 16, 1, 99}); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("corrupt section: %v", err)
	}
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// Transfers have one byte form: out-of-order tenants or hashes, hashes of
// another partition and truncations are refused.
func TestTransferCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	hs := hashesIn(rng, 4, 3)
	slicesSort(hs)
	tr := Transfer{Nonce: 9, Partition: 4, From: 0, To: 2, Now: 77, Series: []fsm.PartitionSeries{
		{Tenant: "a", Hashes: hs, Minutes: []uint8{1, 2, 3}}, {Tenant: "b", Hashes: hs[:1], Minutes: []uint8{4}}}}
	b := AppendTransfer(nil, tr)
	got, err := DecodeTransfer(b, testP)
	if err != nil || got.Count() != 4 || got.Series[1].Minutes[0] != 4 || got.Now != 77 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for i := range len(b) {
		if _, err := DecodeTransfer(b[:i], testP); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	bad := tr
	bad.Series = []fsm.PartitionSeries{tr.Series[1], tr.Series[0]}
	if _, err := DecodeTransfer(AppendTransfer(nil, bad), testP); err == nil {
		t.Fatal("tenants out of order decoded")
	}
	bad = tr
	bad.Partition = 5
	if _, err := DecodeTransfer(AppendTransfer(nil, bad), testP); err == nil {
		t.Fatal("hashes outside the partition decoded")
	}
	if _, err := DecodeGive(AppendGive(nil, Give{Nonce: 1, Partition: testP, To: 1}), testP); err == nil {
		t.Fatal("give of partition P decoded")
	}
}

func slicesSort(h []uint64) {
	for i := range h {
		for j := i + 1; j < len(h); j++ {
			if h[j] < h[i] {
				h[i], h[j] = h[j], h[i]
			}
		}
	}
}

// meterTarget returns a metering target of partition p.
func meterTarget(p int) fsmmeter.Target {
	for i := 0; ; i++ {
		t := fsmmeter.Target{Org: "o", Space: "s", Consumer: "c", Resource: "r", Plan: "p", Instance: string(rune('a'+i%26)) + string(rune('a'+i/26))}
		if layout.Partition(fsmmeter.TargetHash(t), testP) == p {
			return t
		}
	}
}

// A partition-give-metering takes the partition's metering with its series
// and the receive installs both; a plain partition-give leaves the metering
// in the giver, which keeps answering for it.
func TestGiveCarriesMetering(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const p, q = 3, 4 // both group 0's
	now := int64(1_700_000_000_000)
	src, dst := newGroup(t, 0), newGroup(t, 2)
	src.track(t, 1000, "a", hashesIn(rng, p, 10))
	for _, part := range []int{p, q} {
		ev := fsmmeter.Event{Kind: fsmmeter.Start, ID: "start", Target: meterTarget(part), Timestamp: now}
		ev.ID += string(rune('0' + part))
		res := src.mod(t, fsmmeter.EntryEvents, fsmmeter.EncodeEvents(now, 1<<40, []fsmmeter.Event{ev})).([]fsmmeter.Result)
		if res[0].Code != fsmmeter.Created {
			t.Fatalf("start in partition %d: %+v", part, res[0])
		}
	}
	gr := src.mod(t, EntryGiveMetering, AppendGive(nil, Give{Nonce: 1, Partition: p, To: 2})).(GiveResult)
	if gr.Refused != "" || gr.Series != 10 {
		t.Fatalf("give: %+v", gr)
	}
	tb := src.m.Outbox(1)
	tr, err := DecodeTransfer(tb, testP)
	if err != nil || tr.Metering == nil {
		t.Fatalf("transfer: %v, metering %d bytes", err, len(tr.Metering))
	}
	if src.mt.Owns(p) || !src.mt.Owns(q) || len(src.mt.Spans()) != 1 {
		t.Fatalf("giver after the give: owns %v/%v, %d spans", src.mt.Owns(p), src.mt.Owns(q), len(src.mt.Spans()))
	}
	if rr := dst.mod(t, EntryReceive, tb).(ReceiveResult); !rr.Applied || rr.Series != 10 {
		t.Fatalf("receive: %+v", rr)
	}
	if !dst.mt.Owns(p) || len(dst.mt.Spans()) != 1 || dst.mt.Spans()[0].Target != meterTarget(p) {
		t.Fatalf("receiver: owns %v, spans %+v", dst.mt.Owns(p), dst.mt.Spans())
	}
	// A corrupt metering part halts the receiver before anything changes.
	bad := append([]byte(nil), tb...)
	bad[len(bad)-1] ^= 0xff
	other := newGroup(t, 2)
	data, _ := fsm.AppendModuleEntry(nil, EntryReceive, 1000, bad)
	other.idx++
	if res := other.f.Apply(&raft.Log{Index: other.idx, Term: 1, Type: raft.LogCommand, Data: data}); res == nil {
		t.Fatal("a corrupt metering transfer applied")
	} else if _, isErr := res.(error); !isErr {
		t.Fatalf("a corrupt metering transfer answered %T %+v", res, res)
	}
	if other.m.Owns(p) || other.f.TenantActive("a") != 0 {
		t.Fatal("a refused transfer changed the receiver")
	}

	// The plain give moves series only: the metering stays and answers.
	src2 := newGroup(t, 0)
	ev := fsmmeter.Event{Kind: fsmmeter.Start, ID: "x", Target: meterTarget(p), Timestamp: now}
	src2.mod(t, fsmmeter.EntryEvents, fsmmeter.EncodeEvents(now, 1<<40, []fsmmeter.Event{ev}))
	src2.mod(t, EntryGive, AppendGive(nil, Give{Nonce: 2, Partition: p, To: 2}))
	if tr, _ := DecodeTransfer(src2.m.Outbox(2), testP); tr.Metering != nil || !src2.mt.Owns(p) || len(src2.mt.Spans()) != 1 {
		t.Fatal("a plain give moved metering")
	}
}
