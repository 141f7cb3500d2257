package admission

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tollgate-io/tollgate/fsm"
)

const (
	absent = fsm.StateAbsent
	active = fsm.StateActive
	fresh  = fsm.StateFresh
)

func req(tenant string, hashes []uint64, states ...uint8) Request {
	return Request{Tenant: tenant, Hashes: hashes, States: states}
}

// denyOdd refuses odd hashes; it records what it was shown.
type denyOdd struct{ seen []uint64 }

func (d *denyOdd) Admit(_ string, candidates []uint64, deny []bool) {
	d.seen = append(d.seen, candidates...)
	for i, h := range candidates {
		if h%2 == 1 {
			deny[i] = true
		}
	}
}

func TestDecide(t *testing.T) {
	type want struct {
		rejected                      [][]uint64
		entry                         []fsm.TenantHashes
		newBy                         map[string][]uint64
		created, refreshed, rejectedN int
		pending                       hashesBy
	}
	tests := []struct {
		name    string
		reqs    []Request
		pending hashesBy
		budgets map[string]Budget
		checks  []Check
		want    want
	}{
		{
			name:    "new under share",
			reqs:    []Request{req("a", []uint64{10, 11, 12}, absent, absent, absent)},
			budgets: map[string]Budget{"a": {Share: 5, Used: 2}},
			want: want{
				rejected: [][]uint64{nil},
				entry:    []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{10, 11, 12}, New: 3}},
				newBy:    map[string][]uint64{"a": {10, 11, 12}},
				created:  3,
				pending:  hashesBy{"a": {10, 11, 12}},
			},
		},
		{
			name:    "at share: new rejected",
			reqs:    []Request{req("a", []uint64{10, 11}, absent, absent)},
			budgets: map[string]Budget{"a": {Share: 3, Used: 3}},
			want: want{
				rejected:  [][]uint64{{10, 11}},
				rejectedN: 2,
				pending:   hashesBy{},
			},
		},
		{
			name:    "share reached inside the request: later hashes rejected",
			reqs:    []Request{req("a", []uint64{1, 2, 3, 4}, absent, absent, absent, absent)},
			budgets: map[string]Budget{"a": {Share: 4, Used: 2}},
			want: want{
				rejected:  [][]uint64{{3, 4}},
				entry:     []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{1, 2}, New: 2}},
				newBy:     map[string][]uint64{"a": {1, 2}},
				created:   2,
				rejectedN: 2,
				pending:   hashesBy{"a": {1, 2}},
			},
		},
		{
			name:    "refresh of an active series at (and over) share: logged, never rejected",
			reqs:    []Request{req("a", []uint64{7, 8}, active, active)},
			budgets: map[string]Budget{"a": {Share: 1, Used: 5}},
			want: want{
				rejected:  [][]uint64{nil},
				entry:     []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{7, 8}}},
				refreshed: 2,
				pending:   hashesBy{},
			},
		},
		{
			name:    "fresh: accepted, nothing logged",
			reqs:    []Request{req("a", []uint64{7}, fresh)},
			budgets: map[string]Budget{"a": {Share: 1, Used: 1}},
			want:    want{rejected: [][]uint64{nil}, pending: hashesBy{}},
		},
		{
			name:    "pending re-send: accepted, not logged again, not counted",
			reqs:    []Request{req("a", []uint64{5, 6}, absent, absent)},
			pending: hashesBy{"a": {5}},
			budgets: map[string]Budget{"a": {Share: 2, Used: 1}}, // the reservation of 5 is in Used
			want: want{
				rejected: [][]uint64{nil},
				entry:    []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{6}, New: 1}},
				newBy:    map[string][]uint64{"a": {6}},
				created:  1,
				pending:  hashesBy{"a": {5, 6}},
			},
		},
		{
			name:    "unlimited share 0",
			reqs:    []Request{req("a", []uint64{1, 2}, absent, absent)},
			budgets: map[string]Budget{"a": {Share: 0, Used: 1 << 40}},
			want: want{
				rejected: [][]uint64{nil},
				entry:    []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{1, 2}, New: 2}},
				newBy:    map[string][]uint64{"a": {1, 2}},
				created:  2,
				pending:  hashesBy{"a": {1, 2}},
			},
		},
		{
			name: "several tenants in one batch: separate budgets, entry in first-appearance order",
			reqs: []Request{
				req("b", []uint64{1, 2}, absent, absent),
				req("a", []uint64{1, 3}, absent, active),
				req("b", []uint64{4}, absent),
				req("a", []uint64{5}, absent),
			},
			budgets: map[string]Budget{"a": {Share: 10, Used: 9}, "b": {Share: 3, Used: 0}},
			want: want{
				rejected: [][]uint64{nil, nil, nil, {5}},
				entry: []fsm.TenantHashes{
					{Tenant: "b", Hashes: []uint64{1, 2, 4}, New: 3},
					{Tenant: "a", Hashes: []uint64{1, 3}, New: 1},
				},
				newBy:     map[string][]uint64{"a": {1}, "b": {1, 2, 4}},
				created:   4,
				refreshed: 1,
				rejectedN: 1,
				pending:   hashesBy{"a": {1}, "b": {1, 2, 4}},
			},
		},
		{
			name: "request order: the earlier request takes the last slots",
			reqs: []Request{
				req("a", []uint64{1, 2}, absent, absent),
				req("a", []uint64{3}, absent),
			},
			budgets: map[string]Budget{"a": {Share: 4, Used: 2}},
			want: want{
				rejected:  [][]uint64{nil, {3}},
				entry:     []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{1, 2}, New: 2}},
				newBy:     map[string][]uint64{"a": {1, 2}},
				created:   2,
				rejectedN: 1,
				pending:   hashesBy{"a": {1, 2}},
			},
		},
		{
			name: "same hash twice in a batch: created once",
			reqs: []Request{
				req("a", []uint64{9, 9}, absent, absent),
				req("a", []uint64{9}, absent),
			},
			budgets: map[string]Budget{"a": {Share: 1, Used: 0}},
			want: want{
				rejected: [][]uint64{nil, nil},
				entry:    []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{9}, New: 1}},
				newBy:    map[string][]uint64{"a": {9}},
				created:  1,
				pending:  hashesBy{"a": {9}},
			},
		},
		{
			name: "a request without hashes (cancelled) decides nothing",
			reqs: []Request{
				{Tenant: "a"},
				req("b", []uint64{1}, absent),
			},
			budgets: map[string]Budget{"b": {}},
			want: want{
				rejected: [][]uint64{nil, nil},
				entry:    []fsm.TenantHashes{{Tenant: "b", Hashes: []uint64{1}, New: 1}},
				newBy:    map[string][]uint64{"b": {1}},
				created:  1,
				pending:  hashesBy{"b": {1}},
			},
		},
		{
			name:    "check denies before the share is charged; refreshes never reach it",
			reqs:    []Request{req("a", []uint64{1, 2, 3, 4, 6}, absent, absent, active, absent, absent)},
			budgets: map[string]Budget{"a": {Share: 2, Used: 0}},
			checks:  []Check{&denyOdd{}},
			want: want{
				rejected:  [][]uint64{{1, 6}},
				entry:     []fsm.TenantHashes{{Tenant: "a", Hashes: []uint64{2, 3, 4}, New: 2}},
				newBy:     map[string][]uint64{"a": {2, 4}},
				created:   2,
				refreshed: 1,
				rejectedN: 2,
				pending:   hashesBy{"a": {2, 4}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pending := pendingOf(tc.pending)
			asked := map[string]int{}
			budget := func(tenant string) Budget {
				asked[tenant]++
				b, ok := tc.budgets[tenant]
				if !ok {
					t.Fatalf("budget asked for unexpected tenant %q", tenant)
				}
				return b
			}
			d := Decide(tc.reqs, pending, budget, tc.checks)
			for tenant, n := range asked {
				if n != 1 {
					t.Errorf("budget of %q asked %d times, want once per batch", tenant, n)
				}
			}
			got := want{d.Rejected, d.Entry, d.NewBy, d.Created, d.Refreshed, d.RejectedN, livePending(pending)}
			if len(got.entry) == 0 {
				got.entry = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decide:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecideCheckSeesOnlyCandidates(t *testing.T) {
	c := &denyOdd{}
	pending := pendingOf(hashesBy{"a": {5}})
	Decide([]Request{req("a", []uint64{1, 2, 3, 5}, absent, active, fresh, absent)}, pending,
		func(string) Budget { return Budget{} }, []Check{c})
	if want := []uint64{1}; !reflect.DeepEqual(c.seen, want) {
		t.Fatalf("check saw %v, want only the would-be-new hash %v (not active, fresh or pending ones)", c.seen, want)
	}
}

// AtShare counts only hashes refused for the share, not by a Check; a
// negative share (NoHeadroom) rejects every new series but no refresh.
func TestDecideAtShare(t *testing.T) {
	budgets := map[string]Budget{"a": {Share: 3, Used: 1}, "b": {Share: NoHeadroom}}
	reqs := []Request{
		req("a", []uint64{2, 4, 5, 6, 8}, absent, absent, absent, absent, absent),
		req("b", []uint64{20, 21}, active, absent),
	}
	d := Decide(reqs, NewPending(), func(tn string) Budget { return budgets[tn] }, []Check{&denyOdd{}})
	// a: 2 and 4 fill the share (1+2 = 3); 5 is odd (Check); 6 and 8 at share.
	if !reflect.DeepEqual(d.Rejected, [][]uint64{{5, 6, 8}, {21}}) {
		t.Fatalf("rejected %v", d.Rejected)
	}
	if !reflect.DeepEqual(d.AtShare, []int{2, 0}) {
		// 21 is odd, so the Check refused it before the share was looked at.
		t.Fatalf("at share %v", d.AtShare)
	}
	d = Decide([]Request{req("b", []uint64{20, 22}, active, absent)}, NewPending(), func(tn string) Budget { return budgets[tn] }, nil)
	if !reflect.DeepEqual(d.Rejected, [][]uint64{{22}}) || d.AtShare[0] != 1 || d.Refreshed != 1 {
		t.Fatalf("no headroom: rejected %v at share %v refreshed %d", d.Rejected, d.AtShare, d.Refreshed)
	}
}

// TestPendingDropAndBatchCounts: a batch's hashes stop being pending when it
// completes, while a later batch's stay; a re-send of a hash pending from an
// earlier batch is not logged again; once nothing of a tenant is in flight
// and the node keeps more than keepEmptyTenants tables, the tenant's table
// goes.
func TestPendingDropAndBatchCounts(t *testing.T) {
	s := newSession(&Tracker{}, nil)
	decide := func(tenant string, hs ...uint64) *batch {
		states := make([]uint8, len(hs))
		d := Decide([]Request{{Tenant: tenant, Hashes: hs, States: states}}, s.pending, func(string) Budget { return Budget{} }, nil)
		for tenant := range d.NewBy {
			s.batchesWith[tenant]++
		}
		return &batch{newBy: d.NewBy, seq: d.Seq}
	}
	b1 := decide("a", 1, 2)
	b2 := decide("a", 2, 3) // 2 is pending from b1: not logged again
	if got := b2.newBy["a"]; !reflect.DeepEqual(got, []uint64{3}) {
		t.Fatalf("second batch logged %v as new, want [3]", got)
	}
	s.clearPending(b1)
	if got := livePending(s.pending); !reflect.DeepEqual(got, hashesBy{"a": {3}}) || s.batchesWith["a"] != 1 {
		t.Fatalf("after the first batch: pending %v, batches %v; want only 3, one batch", got, s.batchesWith)
	}
	b3 := decide("a", 1, 3) // 1 was applied (its batch completed), 3 is still pending
	if got := b3.newBy["a"]; !reflect.DeepEqual(got, []uint64{1}) {
		t.Fatalf("third batch logged %v as new, want [1]", got)
	}
	s.clearPending(b2)
	s.clearPending(b3)
	if got := livePending(s.pending); len(got) != 0 || len(s.batchesWith) != 0 {
		t.Fatalf("after the last batch: pending %v, batches %v; want empty", got, s.batchesWith)
	}
	if s.pending.sets["a"] == nil {
		t.Fatal("with few tenants an emptied table is kept for the next batch")
	}
	// With many tenants an emptied tenant's table goes.
	for i := range keepEmptyTenants + 1 {
		s.pending.set(fmt.Sprint("t", i))
	}
	s.clearPending(decide("a", 8))
	if _, ok := s.pending.sets["a"]; ok {
		t.Fatalf("with %d tenants the emptied tenant's table must go", len(s.pending.sets))
	}
}

// TestPendingTableThroughBursts: a tenant's table against a plain set over
// many batches of random sizes in flight, completed in order: every hash is
// pending exactly while its batch is in flight, through the rebuilds that
// drop completed batches' hashes and shrink the table after bursts.
func TestPendingTableThroughBursts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := NewPending()
	type inFlight struct {
		seq uint64
		hs  []uint64
	}
	var flight []inFlight
	want := map[uint64]bool{}
	for round := range 8000 {
		n := r.IntN(50)
		if round < 1000 && round%400 < 20 {
			n = 2000 // a burst, then a long quiet tail
		}
		seq := p.Begin()
		var hs []uint64
		for range n {
			h := r.Uint64() % 50000 // collisions with earlier batches' hashes
			if pendingHas(p, "a", h) != want[h] {
				t.Fatalf("round %d: Has(%d) = %v, want %v", round, h, !want[h], want[h])
			}
			if want[h] {
				continue
			}
			p.set("a").add(h, seq, p.done)
			want[h] = true
			hs = append(hs, h)
		}
		flight = append(flight, inFlight{seq, hs})
		for len(flight) > 0 && (len(flight) > 4 || r.IntN(3) == 0) {
			p.Done(flight[0].seq)
			for _, h := range flight[0].hs {
				delete(want, h)
			}
			flight = flight[1:]
		}
		if got := len(livePending(p)["a"]); got != len(want) {
			t.Fatalf("round %d: %d pending, want %d", round, got, len(want))
		}
	}
	// Every half-table of adds halves a table the live hashes do not need:
	// the bursts' tables (65,536 slots) are back to a few thousand.
	if n := len(p.sets["a"].keys); n > 1024 {
		t.Errorf("long after the bursts the table has %d slots for %d pending hashes", n, len(want))
	}
}
