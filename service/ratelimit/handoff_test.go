package ratelimit

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	for _, o := range []*Owner{oldOwner, newOwner} {
		o.SetLayout(layout.ArithmeticTable(p, g), now) // the table each found at its start
		o.SetLayout(tab, now)
	}
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
	other.SetLayout(layout.ArithmeticTable(p, g), now)
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
	// A table found at the start is no move: nothing is fetched.
	fresh := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	fresh.SetLayout(tab, now)
	if r, _ := fresh.Admit(name, 1, now, true, Asker{ID: 3}); !r.Admitted {
		t.Fatalf("a key of a table this node started with: %+v, want admitted", r)
	}
	// Long after the move, a key is new here, not handed over.
	late := mustNew(t, Config{Sliding: sliding}, p, g, limits)
	late.SetLayout(layout.ArithmeticTable(p, g), now)
	late.SetLayout(tab, now)
	if r, _ := late.Admit(name, 1, now.Add(handoffFor), true, Asker{ID: 3}); !r.Admitted {
		t.Fatalf("a key first asked %v after its move: %+v, want admitted", handoffFor, r)
	}
}

// TestServiceHandoffOverGRPC: the hand-off end to end between two services
// on loopback gRPC. The old owner has admitted 7 of a 10-per-second key's
// tokens; a raise's table moves the key to a group the other node leads.
// The new owner's first ask (Service.Admit) fetches the key from the old
// one (RateAdmit.Handoff: it takes the newest table itself, releases the
// key and answers with its window), so it admits 3 more and refuses the
// rest of the second; the old owner redirects from then on.
func TestServiceHandoffOverGRPC(t *testing.T) {
	const p, g = 64, 4
	limits := func(string) (float64, int64) { return 10, 10 }
	sliding := func(string) bool { return true }
	var name string
	for i := 0; ; i++ {
		if name = fmt.Sprintf("envoy-%d", i); api.RateGroup(name, p, g) == 1 {
			break
		}
	}
	arith := layout.ArithmeticTable(p, g)
	moved := (&layout.Table{Epoch: 1, Groups: 8, Owner: arith.Owner}).Move(api.RatePartition(name, p), 5)
	var oldTable atomic.Pointer[layout.Table]
	oldTable.Store(arith)
	var oldAddr string
	oldSvc, err := NewService(ServiceConfig{
		Owner: Config{Sliding: sliding}, Owns: func(g int) bool { return g == 1 },
		LeaderOf: func(int) (string, string) { return "", "" }, Layout: oldTable.Load,
	}, p, g, limits)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	oldAddr = lis.Addr().String()
	gs := grpc.NewServer()
	api.RegisterRateAdmitServer(gs, oldSvc)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	cc, err := grpc.NewClient(oldAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	newSvc, err := NewService(ServiceConfig{
		Owner: Config{Sliding: sliding}, Owns: func(g int) bool { return g == 5 },
		LeaderOf: func(g int) (string, string) {
			if g == 1 {
				return "old", oldAddr
			}
			return "", ""
		},
		Layout: func() *layout.Table { return moved },
		Peer: func(addr string) (grpc.ClientConnInterface, error) {
			if addr != oldAddr {
				return nil, fmt.Errorf("no peer at %s", addr)
			}
			return cc, nil
		},
	}, p, g, limits)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(svc *Service, client uint64) *api.RateUpdate {
		t.Helper()
		u, err := svc.Admit(context.Background(), &api.RateReport{ClientId: client, NewNames: []string{name}, ConsumedTotal: []uint64{1}})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	oldSvc.o.SetLayout(arith, time.Now())
	for i := range 7 {
		if u := ask(oldSvc, uint64(1+i%3)); len(u.Cap) == 0 || u.Cap[0] != 1 {
			t.Fatalf("ask %d on the old owner: %v", i, u)
		}
	}
	// The new owner has the moved table; the old one not yet (it takes it
	// when asked for the hand-off, as its next round would).
	newSvc.o.SetLayout(arith, time.Now())
	newSvc.o.SetLayout(moved, time.Now())
	oldTable.Store(moved)
	var admitted, refused int
	for i := range 6 {
		u := ask(newSvc, uint64(1+i%3))
		switch {
		case len(u.Cap) > 0 && u.Cap[0] == 1:
			admitted++
		case len(u.Cap) > 0:
			refused++
		default:
			t.Fatalf("ask %d on the new owner: %v", i, u)
		}
	}
	if admitted != 3 || refused != 3 {
		t.Fatalf("new owner admitted %d and refused %d of 6 with 7 of 10 admitted by the old owner, want 3 and 3", admitted, refused)
	}
	if h, m := newSvc.Handoffs(); h != 1 || m != 0 {
		t.Fatalf("hand-offs %d, missed %d; want 1, 0", h, m)
	}
	if u := ask(oldSvc, 1); len(u.Redirects) != 1 || len(u.Cap) != 0 {
		t.Fatalf("old owner after the hand-off: %v, want a redirect", u)
	}
	// Bad input is refused, naming the field.
	for _, keys := range [][]string{nil, {""}} {
		if _, err := api.NewRateAdmitClient(cc).Handoff(context.Background(), &api.RateHandoffRequest{Keys: keys}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("handoff of %q: %v, want InvalidArgument", keys, err)
		}
	}
}
