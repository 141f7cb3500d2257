package ratelimit

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/ratelease"
)

// TestSetLayoutMovesTheOwner: a raise moves a tenant's partition to a new
// group. The owner of its old group stops owning it at its next round and
// tells the client it moved (moved_ids); the new group's leader, routing by
// the same table, takes it over from the client's report and grants it a
// lease. Before the table reached the owner, rate state stayed on the groups
// the cluster was created with.
func TestSetLayoutMovesTheOwner(t *testing.T) {
	const p, g = 64, 4
	now := time.Unix(1_800_000_000, 0)
	limits := func(string) (float64, int64) { return 100, 100 }
	oldOwner := mustNew(t, Config{}, p, g, limits)
	newOwner := mustNew(t, Config{}, p, g, limits)
	var name string
	for i := 0; ; i++ {
		if name = fmt.Sprintf("tenant-%d", i); api.RateGroup(name, p, g) == 1 {
			break
		}
	}
	l, err := ratelease.NewLimiter(ratelease.LimiterConfig{Strategy: ratelease.Lease, Now: func() time.Time { return now }, ClientID: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := ratelease.NewReportState()
	owns := func(want int) func(int) bool { return func(g int) bool { return g == want } }
	noLeader := func(int) (string, string) { return "", "" }
	round := func(o *Owner, s *Session, g int) *api.RateUpdate {
		now = now.Add(100 * time.Millisecond)
		l.Tick(now)
		if err := s.Absorb(l.Report(st, nil), now); err != nil {
			t.Fatal(err)
		}
		o.Tick(now, owns(g), noLeader)
		u := s.Take()
		if u != nil {
			if _, err := l.Apply(u, now); err != nil {
				t.Fatal(err)
			}
		}
		return u
	}
	l.Decide(name, 1)
	s1 := oldOwner.NewSession()
	for range 3 {
		round(oldOwner, s1, 1)
	}
	if d := l.Decide(name, 1); !d.Allowed || !d.Limited {
		t.Fatalf("under its old owner: %+v, want admitted from a lease", d)
	}

	tab := layout.ArithmeticTable(p, g)
	tab = (&layout.Table{Epoch: 1, Groups: 8, Owner: tab.Owner}).Move(api.RatePartition(name, p), 5)
	if !oldOwner.SetLayout(tab, now) || !newOwner.SetLayout(tab, now) {
		t.Fatal("SetLayout refused a newer table")
	}
	if oldOwner.SetLayout(&layout.Table{Epoch: 1, Groups: 8, Owner: tab.Owner}, now) {
		t.Error("SetLayout took a table no newer than its own")
	}
	if got := oldOwner.groupOf(name); got != 5 {
		t.Fatalf("after the move the tenant's group is %d, want 5", got)
	}
	u := round(oldOwner, s1, 1)
	if u == nil || len(u.MovedIds) == 0 {
		t.Fatalf("the old owner's next update %v: want the tenant's id in moved_ids", u)
	}
	// The client reconnects to group 5's leader: a new stream, whose first
	// report carries the tenant.
	st = ratelease.NewReportState()
	s2 := newOwner.NewSession()
	var granted bool
	for range 5 {
		if u := round(newOwner, s2, 5); u != nil && slices.ContainsFunc(u.Cap, func(c uint64) bool { return c > 0 }) {
			granted = true
		}
	}
	if !granted {
		t.Fatal("group 5's leader never granted the moved tenant a lease")
	}
	if d := l.Decide(name, 1); !d.Allowed {
		t.Fatalf("under its new owner: %+v, want admitted", d)
	}
}

// TestColdBucketAskAfterItsReport: a node's first request of a token-bucket
// key asks the owner (it holds no lease), but its report naming the key can
// reach the owner, and be ticked, before the ask does (an ask slowed on a
// loaded node). The asker has no share to be over: it is admitted from the
// bucket, as any cold key's first request. (It was refused: server
// TestEnvoyRLSPerUnitSpaced under -race, "warm key request 1 refused".) A
// client whose lease does not cover a request is still refused.
func TestColdBucketAskAfterItsReport(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	o := mustNew(t, Config{}, 64, 4, func(string) (float64, int64) { return 100, 100 })
	l, err := ratelease.NewLimiter(ratelease.LimiterConfig{Strategy: ratelease.Lease, Now: func() time.Time { return now }, ClientID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ask := l.Local("k", 1); !ask {
		t.Fatal("a cold key's first request was decided without the owner")
	}
	s := o.NewSession()
	if err := s.Absorb(l.Report(ratelease.NewReportState(), nil), now); err != nil {
		t.Fatal(err)
	}
	now = now.Add(100 * time.Millisecond)
	o.Tick(now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
	from := Asker{ID: 1}
	from.Consumed, from.Cap, from.Known = l.Held("k")
	r, err := o.Admit("k", 1, now, true, from)
	if err != nil || !r.Admitted {
		t.Fatalf("the ask after its report was ticked: %+v, %v; want admitted (no lease held)", r, err)
	}
	if r, err := o.Admit("k", 1, now, true, Asker{ID: 2, Known: true, Consumed: 5, Cap: 5}); err != nil || r.Admitted {
		t.Fatalf("a client whose lease is spent: %+v, %v; want refused (over its share)", r, err)
	}
}
