package shares

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/snapfmt"
	"github.com/tollgate-io/tollgate/layout"
)

const (
	testP = 64
	testG = 4
	testS = 4
)

type group struct {
	f   *fsm.FSM
	m   *Module
	idx uint64
}

func newGroup(t testing.TB, g int) *group {
	t.Helper()
	m, err := New(g, testG)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fsm.New(fsm.Config{Partitions: testP, Groups: testG, Shards: testS, Group: g, Modules: []fsm.Module{m}})
	if err != nil {
		t.Fatal(err)
	}
	return &group{f: f, m: m}
}

func (g *group) apply(t testing.TB, typ byte, payload []byte) any {
	t.Helper()
	data, err := fsm.AppendModuleEntry(nil, typ, 100, payload)
	if err != nil {
		t.Fatal(err)
	}
	g.idx++
	res := g.f.Apply(&raft.Log{Index: g.idx, Term: 1, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); ok {
		t.Fatalf("apply type %d: %v", typ, err)
	}
	return res
}

func snap(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Persist(&sink{Buffer: &buf}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type sink struct{ *bytes.Buffer }

func (sink) ID() string    { return "test" }
func (sink) Cancel() error { return nil }
func (sink) Close() error  { return nil }

func TestSplitSumsToLimit(t *testing.T) {
	for _, p := range []int{1, 7, 64, 1024} {
		for _, gs := range []int{1, 3, 4, 7} {
			if gs > p {
				continue
			}
			for _, limit := range []int64{0, 1, 5, 99, 100, 1000, 150000, 1 << 40} {
				var sum int64
				for g := range gs {
					lo, hi := layout.GroupRange(g, p, gs)
					b := Split(limit, lo, hi, p)
					if b < 0 {
						t.Fatalf("negative base %d", b)
					}
					sum += b
				}
				if sum != limit {
					t.Fatalf("p=%d groups=%d limit=%d: bases sum to %d", p, gs, limit, sum)
				}
			}
		}
	}
}

// A transfer moves headroom in two logs; in between it is in transit and
// counted nowhere; duplicates of the receive change nothing; the complete
// forgets it on the giver.
func TestTransferLifecycle(t *testing.T) {
	a, b := newGroup(t, 0), newGroup(t, 1)
	a.idx = 10 // seqs are raft indexes: leave room for a stale older one
	nonce := a.m.Reserve("t", 7)
	if _, res := a.m.Delta("t"); res != 7 {
		t.Fatalf("reserved %d", res)
	}
	gr := a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "t", To: 1, Amount: 7, Nonce: nonce})).(GiveResult)
	if gr.Refused != "" || gr.Seq != a.idx {
		t.Fatalf("give: %+v", gr)
	}
	if d, res := a.m.Delta("t"); d != -7 || res != 0 {
		t.Fatalf("giver delta %d reserved %d after give", d, res)
	}
	// A second give to the same receiver while one is outstanding is refused.
	if r := a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "t", To: 1, Amount: 1})).(GiveResult); r.Refused == "" {
		t.Fatal("second outstanding give to the same group accepted")
	}
	if b.m.Received("t", 0, gr.Seq) {
		t.Fatal("received before the receive entry")
	}
	for i := range 3 {
		rr := b.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "t", From: 0, Seq: gr.Seq, Amount: 7})).(ReceiveResult)
		if rr.Applied != (i == 0) {
			t.Fatalf("receive #%d applied=%v", i, rr.Applied)
		}
	}
	if d, _ := b.m.Delta("t"); d != 7 {
		t.Fatalf("receiver delta %d", d)
	}
	if !b.m.Received("t", 0, gr.Seq) || len(a.m.Outstanding()) != 1 {
		t.Fatal("bookkeeping")
	}
	if cr := a.apply(t, EntryComplete, AppendComplete(nil, Complete{Tenant: "t", Seq: gr.Seq})).(CompleteResult); !cr.Found {
		t.Fatal("complete did not find the transfer")
	}
	if len(a.m.Outstanding()) != 0 {
		t.Fatal("outstanding after complete")
	}
	// An older seq arriving late (a stale retry) is a duplicate.
	if rr := b.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "t", From: 0, Seq: gr.Seq - 1, Amount: 3})).(ReceiveResult); rr.Applied {
		t.Fatal("stale receive applied")
	}
	// Semantic refusals change nothing.
	if r := a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "t", To: 0, Amount: 1})).(GiveResult); r.Refused == "" {
		t.Fatal("give to self accepted")
	}
	if r := b.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "t", From: 1, Seq: 99, Amount: 1})).(ReceiveResult); r.Refused == "" {
		t.Fatal("receive from self accepted")
	}
	if d, _ := a.m.Delta("t"); d != -7 {
		t.Fatalf("refusals changed the delta to %d", d)
	}
}

// Random transfers between groups, with receives lost, duplicated and
// re-driven: at every step Σ shares + in transit = limit, so Σ shares ≤ limit.
func TestRandomTransfersConserveLimit(t *testing.T) {
	const limit = 1000
	r := rand.New(rand.NewPCG(1, 2))
	gs := make([]*group, testG)
	for i := range gs {
		gs[i] = newGroup(t, i)
	}
	share := func(i int) int64 {
		lo, hi := layout.GroupRange(i, testP, testG)
		d, res := gs[i].m.Delta("t")
		return Split(limit, lo, hi, testP) + d - res
	}
	inTransit := func() int64 {
		var n int64
		for _, g := range gs {
			for _, o := range g.m.Outstanding() {
				if !gs[o.To].m.Received(o.Tenant, g.m.Group(), o.Seq) {
					n += o.Amount
				}
			}
		}
		return n
	}
	for step := 0; step < 3000; step++ {
		from := r.IntN(testG)
		switch r.IntN(3) {
		case 0: // give some of the giver's share
			to := (from + 1 + r.IntN(testG-1)) % testG
			if s := share(from); s > 0 && !gs[from].m.HasOutstandingTo("t", to) {
				amt := 1 + r.Int64N(s)
				n := gs[from].m.Reserve("t", amt)
				gs[from].apply(t, EntryGive, AppendGive(nil, Give{Tenant: "t", To: to, Amount: amt, Nonce: n}))
			}
		case 1: // deliver (or re-deliver) an outstanding transfer
			if out := gs[from].m.Outstanding(); len(out) > 0 {
				o := out[r.IntN(len(out))]
				gs[o.To].apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "t", From: from, Seq: o.Seq, Amount: o.Amount}))
				if r.IntN(2) == 0 {
					gs[from].apply(t, EntryComplete, AppendComplete(nil, Complete{Tenant: "t", Seq: o.Seq}))
				}
			}
		case 2: // complete one that was received
			for _, o := range gs[from].m.Outstanding() {
				if gs[o.To].m.Received("t", from, o.Seq) {
					gs[from].apply(t, EntryComplete, AppendComplete(nil, Complete{Tenant: "t", Seq: o.Seq}))
					break
				}
			}
		}
		var sum int64
		for i := range gs {
			if share(i) < 0 {
				t.Fatalf("step %d: group %d share %d < 0", step, i, share(i))
			}
			sum += share(i)
		}
		if sum+inTransit() != limit {
			t.Fatalf("step %d: Σ shares %d + in transit %d ≠ limit %d", step, sum, inTransit(), limit)
		}
	}
}

func TestSnapshotRoundTripAndOldSnapshots(t *testing.T) {
	a := newGroup(t, 2)
	old := snap(t, a.f) // no module state yet: format version 1
	if old[6] != 1 {
		t.Fatalf("empty module wrote format version %d", old[6])
	}
	n := a.m.Reserve("x", 5)
	if a.m.MovesApplied() {
		t.Fatal("a reservation alone counts as an applied move")
	}
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "x", To: 0, Amount: 5, Nonce: n}))
	a.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "y", From: 3, Seq: 17, Amount: 9}))
	a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "y", To: 1, Amount: 2}))
	b1 := snap(t, a.f)
	if b1[6] != 2 {
		t.Fatalf("format version %d, want 2", b1[6])
	}
	sum, err := snapfmt.Inspect(bytes.NewReader(b1))
	if err != nil || len(sum.Sections) != 1 || sum.Sections[0].Name != Name {
		t.Fatalf("sections %+v %v", sum, err)
	}
	b := newGroup(t, 2)
	b.m.Reserve("x", 3) // leader-local: a restore drops it
	if err := b.f.Restore(io.NopCloser(bytes.NewReader(b1))); err != nil {
		t.Fatal(err)
	}
	for _, tn := range []string{"x", "y"} {
		va, vb := a.m.View(tn), b.m.View(tn)
		if va.Delta != vb.Delta || len(va.Outstanding) != len(vb.Outstanding) || vb.ReservedOut != 0 {
			t.Fatalf("%s: restored %+v, want %+v", tn, vb, va)
		}
	}
	if !b.m.Received("y", 3, 17) || b.m.Received("y", 3, 18) {
		t.Fatal("received seqs not restored")
	}
	if !a.m.MovesApplied() || !b.m.MovesApplied() {
		// A restarted leader relies on it before gossip tells it its
		// peers' versions (server moveGate).
		t.Fatalf("moves applied: %v, restored %v; want both", a.m.MovesApplied(), b.m.MovesApplied())
	}
	if !bytes.Equal(snap(t, b.f), b1) {
		t.Fatal("snapshot of restored state differs")
	}
	// A snapshot from before shares existed loads: every delta 0.
	if err := b.f.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.m.Delta("x"); d != 0 || len(b.m.Tenants()) != 0 || b.m.MovesApplied() {
		t.Fatalf("after old snapshot: delta %d tenants %v", d, b.m.Tenants())
	}
	// A section of another group is refused and changes nothing.
	c := newGroup(t, 1)
	c.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "z", From: 0, Seq: 1, Amount: 1}))
	sec, _ := a.m.Snapshot()
	raw, _ := sec()
	if _, err := c.m.PrepareRestore(raw); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("restore of another group's section: %v", err)
	}
	if _, err := a.m.PrepareRestore(raw[:len(raw)-1]); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("restore of a truncated section: %v", err)
	}
	if d, _ := c.m.Delta("z"); d != 1 {
		t.Fatal("failed restore changed state")
	}
}

func TestBadPayloadsRefused(t *testing.T) {
	good := AppendGive(nil, Give{Tenant: "t", To: 1, Amount: 3, Nonce: 2})
	if g, err := DecodeGive(good); err != nil || g.Amount != 3 || g.To != 1 || g.Nonce != 2 {
		t.Fatalf("%+v %v", g, err)
	}
	bad := [][]byte{
		nil,
		good[:len(good)-1],
		append(append([]byte(nil), good...), 0),
		AppendGive(nil, Give{Tenant: "t", To: 1, Amount: 0}),
		AppendGive(nil, Give{Tenant: "", To: 1, Amount: 1}),
		AppendGive(nil, Give{Tenant: "t", To: maxGroups, Amount: 1}),
	}
	for i, b := range bad {
		if _, err := DecodeGive(b); !errors.Is(err, ErrBadPayload) {
			t.Fatalf("bad give %d decoded: %v", i, err)
		}
	}
	if _, err := DecodeReceive(AppendReceive(nil, Receive{Tenant: "t", From: 1, Seq: 0, Amount: 1})); err == nil {
		t.Fatal("receive with seq 0 decoded")
	}
	// Applied through the FSM, an undecodable payload halts the group.
	g := newGroup(t, 0)
	data, _ := fsm.AppendModuleEntry(nil, EntryGive, 1, []byte{0x01})
	res := g.f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: data})
	if err, ok := res.(error); !ok || !errors.Is(err, fsm.ErrHalted) {
		t.Fatalf("bad payload response %v", res)
	}
	if _, err := New(4, 4); err == nil {
		t.Fatal("group out of range accepted")
	}
}

// A replica that supports only cluster version 2 does not know the types.
func TestEntryTypesNeedClusterVersion3(t *testing.T) {
	for _, typ := range []byte{EntryGive, EntryReceive, EntryComplete} {
		info, ok := fsm.LookupEntryType(typ)
		if !ok || info.Since != 3 || info.Module != Name {
			t.Fatalf("type %d: %+v", typ, info)
		}
	}
}

// A group created with the cluster knows only the groups of that count: the
// version-3 give and receive refuse a group a raise added, the wide types
// (cluster version 7) accept it.
func TestWideGiveAndReceive(t *testing.T) {
	a := newGroup(t, 0) // knows testG groups
	const raised = testG + 1
	if a.m.Known(raised) || !a.m.Known(testG-1) {
		t.Fatal("Known")
	}
	if r := a.apply(t, EntryGive, AppendGive(nil, Give{Tenant: "t", To: raised, Amount: 1})).(GiveResult); r.Refused == "" {
		t.Fatal("version-3 give to a raised group accepted")
	}
	if r := a.apply(t, EntryGiveWide, AppendGive(nil, Give{Tenant: "t", To: raised, Amount: 1})).(GiveResult); r.Refused != "" {
		t.Fatalf("wide give refused: %s", r.Refused)
	}
	if r := a.apply(t, EntryReceive, AppendReceive(nil, Receive{Tenant: "u", From: raised, Seq: 5, Amount: 2})).(ReceiveResult); r.Refused == "" {
		t.Fatal("version-3 receive from a raised group accepted")
	}
	if r := a.apply(t, EntryReceiveWide, AppendReceive(nil, Receive{Tenant: "u", From: raised, Seq: 5, Amount: 2})).(ReceiveResult); !r.Applied {
		t.Fatalf("wide receive: %+v", r)
	}
	if d, _ := a.m.Delta("u"); d != 2 {
		t.Fatalf("delta after wide receive: %d", d)
	}
}
