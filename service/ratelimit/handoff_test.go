package ratelimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
)

// TestHandoffCarriesTheWindow: a 20-per-second sliding key is decided on
// request (Admit) by the leader of its group. A raise moves it to a group
// another node leads; both nodes take the new table. The new owner holds
// the key (Unseen) until the old one hands it over; the old one, once
// released, decides the key no more (ErrNotOwner); after Import the new
// owner's window holds what the old one admitted, so it admits only the
// rest of the limit in the window, and a client the old owner knew is not
// held back as unseen. Without a hand-off the wait ends after handoffWait
// and the key is decided as after a takeover.
func TestHandoffCarriesTheWindow(t *testing.T) {
	const p, g, limit = 64, 4, 20
	now := time.Unix(1_800_000_000, 0)
	limits := func(string) (float64, int64) { return limit, limit }
	sliding := func(string) bool { return true }
	oldOwner := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	newOwner := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	var name string
	for i := 0; ; i++ {
		if name = fmt.Sprintf("envoy-%d", i); api.RateGroup(name, p, g) == 1 {
			break
		}
	}
	// Clients 1 and 2 ask the old owner for 12 tokens, 6 each.
	for i := range 12 {
		from := Asker{ID: uint64(1 + i%2)}
		if r, err := oldOwner.Admit(name, 1, now, true, from); err != nil || !r.Admitted {
			t.Fatalf("ask %d on the old owner: %+v, %v", i, r, err)
		}
		now = now.Add(10 * time.Millisecond)
	}
	tab := layout.ArithmeticTable(p, g)
	tab = (&layout.Table{Epoch: 1, Groups: 8, Owner: tab.Owner}).Move(api.RatePartition(name, p), 5)
	now = now.Add(50 * time.Millisecond)
	oldOwner.SetLayout(tab, now)
	newOwner.SetLayout(tab, now)
	owns := func(want int) func(int) bool { return func(g int) bool { return g == want } }

	// The new owner holds the key until the hand-off.
	r, err := newOwner.Admit(name, 1, now, true, Asker{ID: 1, History: 6})
	if err != nil || r.Admitted || !r.Unseen {
		t.Fatalf("new owner before the hand-off: %+v, %v; want held (Unseen)", r, err)
	}
	if from, ok := newOwner.HandoffPending(name); !ok || from != 1 {
		t.Fatalf("pending hand-off from group %d (%v), want 1", from, ok)
	}
	// The old owner releases only once its table moved the key away.
	if _, err := oldOwner.Release([]string{name}, now, owns(5)); err != ErrStillOwner {
		t.Fatalf("release by a node that leads the key's group: %v, want ErrStillOwner", err)
	}
	unseen := ""
	for i := 0; unseen == ""; i++ {
		if k := fmt.Sprintf("never-%d", i); api.RateGroupIn(k, tab) != 1 {
			unseen = k
		}
	}
	hks, err := oldOwner.Release([]string{name, unseen}, now, owns(1))
	if err != nil || len(hks) != 2 || !hks[0].Known || hks[1].Known {
		t.Fatalf("release: %+v, %v", hks, err)
	}
	var sum float64
	for _, n := range hks[0].Tokens {
		sum += n
	}
	if sum != 12 || len(hks[0].Clients) != 2 {
		t.Fatalf("handed %v tokens for %d clients, want 12 for 2", sum, len(hks[0].Clients))
	}
	if _, err := oldOwner.Admit(name, 1, now, true, Asker{ID: 2}); err != ErrNotOwner {
		t.Fatalf("old owner after release (its call read the old table): %v, want ErrNotOwner", err)
	}
	if !newOwner.Import(hks[0], now) {
		t.Fatal("import refused")
	}
	if _, ok := newOwner.HandoffPending(name); ok {
		t.Fatal("still pending after the import")
	}
	admitted := 0
	for i := range 20 {
		r, err := newOwner.Admit(name, 1, now, true, Asker{ID: uint64(1 + i%2), History: 6})
		if err != nil || r.Unseen {
			t.Fatalf("ask %d on the new owner: %+v, %v", i, r, err)
		}
		if r.Admitted {
			admitted++
		}
	}
	if admitted != limit-12 {
		t.Fatalf("the new owner admitted %d in the window the old one had filled with 12, want %d", admitted, limit-12)
	}

	// No hand-off: the wait ends after handoffWait.
	other := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	other.SetLayout(tab, now)
	if r, _ := other.Admit(name, 1, now, true, Asker{ID: 3}); !r.Unseen {
		t.Fatalf("before the wait ends: %+v, want held", r)
	}
	other.Tick(now.Add(handoffWait), owns(5), func(int) (string, string) { return "", "" })
	if r, err := other.Admit(name, 1, now.Add(handoffWait), true, Asker{ID: 3}); err != nil || !r.Admitted {
		t.Fatalf("after the wait ended: %+v, %v; want admitted (as after a takeover)", r, err)
	}
	if other.handoffsMissed.Load() != 1 {
		t.Fatalf("missed hand-offs %d, want 1", other.handoffsMissed.Load())
	}
	// Long after the move, a key is new here, not handed over.
	late := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	late.SetLayout(tab, now)
	if r, _ := late.Admit(name, 1, now.Add(handoffFor), true, Asker{ID: 3}); !r.Admitted {
		t.Fatalf("a key first asked %v after its move: %+v, want admitted", handoffFor, r)
	}
}
