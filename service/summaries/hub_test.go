package summaries

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// tableSource is a scripted Source: the hub's own logic is under test here;
// the server's Source over real replicas is tested through the cluster tests
// in clientlib.
type tableSource struct {
	mu      sync.Mutex
	applied []uint64
	why     []string
	near    [][]string
	nearN   int // Near calls
}

func newTableSource(g int) *tableSource {
	return &tableSource{applied: make([]uint64, g), why: make([]string, g), near: make([][]string, g)}
}

func (s *tableSource) Replica(g int) (uint64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[g], s.why[g]
}

func (s *tableSource) Near(g int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nearN++
	return slices.Clone(s.near[g])
}

func (s *tableSource) set(g int, applied uint64, near ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied[g], s.near[g], s.why[g] = applied, near, ""
}

func newHub(t *testing.T, src Source, groups, buffer int) *Hub {
	t.Helper()
	h, err := New(Config{Groups: groups, Source: src, NodeID: "n1", Buffer: buffer, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// next returns the queued update, failing if there is none.
func next(t *testing.T, s *Subscription) *api.SummaryUpdate {
	t.Helper()
	select {
	case u := <-s.Updates():
		return u
	default:
		t.Fatal("no update queued")
		return nil
	}
}

func none(t *testing.T, s *Subscription) {
	t.Helper()
	select {
	case u := <-s.Updates():
		t.Fatalf("unexpected update %v", u)
	default:
	}
}

func TestDiff(t *testing.T) {
	a, r := diff([]string{"a", "c", "d"}, []string{"b", "c", "e"})
	if !slices.Equal(a, []string{"b", "e"}) || !slices.Equal(r, []string{"a", "d"}) {
		t.Fatalf("added %v removed %v", a, r)
	}
	if a, r := diff(nil, nil); a != nil || r != nil {
		t.Fatalf("empty: %v %v", a, r)
	}
}

func TestFullStateThenChanges(t *testing.T) {
	src := newTableSource(3)
	src.set(0, 10, "hot")
	src.set(1, 5)
	src.why[2] = "no replica of group 2 on this node"
	h := newHub(t, src, 3, 8)

	sub, err := h.Subscribe(nil)
	if err != nil {
		t.Fatal(err)
	}
	u := next(t, sub)
	if len(u.Groups) != 3 || u.ServedBy != "n1" {
		t.Fatalf("first update %v: want all 3 groups", u)
	}
	if g := u.Groups[0]; !g.Full || g.AppliedIndex != 10 || !slices.Equal(g.Added, []string{"hot"}) {
		t.Errorf("group 0: %v", g)
	}
	if g := u.Groups[1]; !g.Full || g.AppliedIndex != 5 || len(g.Added) != 0 {
		t.Errorf("group 1: %v", g)
	}
	if g := u.Groups[2]; g.Unavailable == "" || g.Full {
		t.Errorf("group 2 should be unavailable: %v", g)
	}

	// Nothing moved: nothing sent, and the sets are not recomputed.
	calls := src.nearN
	h.Tick(time.Now())
	none(t, sub)
	if src.nearN != calls {
		t.Errorf("Near called %d times with no applied index moving", src.nearN-calls)
	}

	// Group 1 gains a tenant, group 0 loses one and gains another.
	src.set(1, 7, "warm")
	src.set(0, 12, "other")
	h.Tick(time.Now())
	u = next(t, sub)
	if len(u.Groups) != 2 {
		t.Fatalf("want changes for 2 groups, got %v", u)
	}
	byGroup := map[uint32]*api.GroupSummary{}
	for _, g := range u.Groups {
		byGroup[g.Group] = g
	}
	if g := byGroup[0]; g.Full || g.AppliedIndex != 12 || !slices.Equal(g.Added, []string{"other"}) || !slices.Equal(g.Removed, []string{"hot"}) {
		t.Errorf("group 0 change %v", g)
	}
	if g := byGroup[1]; g.Full || !slices.Equal(g.Added, []string{"warm"}) || len(g.Removed) != 0 {
		t.Errorf("group 1 change %v", g)
	}

	// Applied index moves but the set does not: no update.
	src.set(1, 9, "warm")
	h.Tick(time.Now())
	none(t, sub)

	// Group 2 becomes available: a full set for it.
	src.set(2, 3, "z")
	h.Tick(time.Now())
	u = next(t, sub)
	if len(u.Groups) != 1 || !u.Groups[0].Full || u.Groups[0].Group != 2 || !slices.Equal(u.Groups[0].Added, []string{"z"}) {
		t.Errorf("group 2 back: %v", u)
	}
	// And unavailable again.
	src.mu.Lock()
	src.why[2] = "lost contact with the leader"
	src.mu.Unlock()
	h.Tick(time.Now())
	u = next(t, sub)
	if len(u.Groups) != 1 || u.Groups[0].Unavailable != "lost contact with the leader" {
		t.Errorf("group 2 gone: %v", u)
	}
}

func TestGroupFilterAndHeartbeat(t *testing.T) {
	src := newTableSource(4)
	h, err := New(Config{Groups: 4, Source: src, NodeID: "n1", Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Subscribe([]uint32{4}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("group out of range: %v, want InvalidArgument", err)
	}
	sub, err := h.Subscribe([]uint32{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	if u := next(t, sub); len(u.Groups) != 2 || u.Groups[0].Group != 1 || u.Groups[1].Group != 3 {
		t.Fatalf("first update %v: want groups 1 and 3", u)
	}
	src.set(0, 4, "a") // not subscribed
	t0 := time.Now()
	h.Tick(t0.Add(500 * time.Millisecond))
	none(t, sub)
	h.Tick(t0.Add(time.Second))
	u := next(t, sub)
	if !u.Heartbeat || len(u.Groups) != 2 || u.Groups[0].Group != 1 || u.Groups[1].Group != 3 {
		t.Fatalf("heartbeat %v: want groups 1 and 3 only", u)
	}
}

func TestSlowSubscriberDroppedOthersServed(t *testing.T) {
	src := newTableSource(1)
	h := newHub(t, src, 1, 2)
	slow, err := h.Subscribe(nil)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := h.Subscribe(nil)
	if err != nil {
		t.Fatal(err)
	}
	next(t, fast)
	for i := range 5 {
		src.set(0, uint64(10+i), string(rune('a'+i)))
		h.Tick(time.Now())
		if u := next(t, fast); len(u.Groups) != 1 {
			t.Fatalf("fast subscriber: %v", u)
		}
	}
	select {
	case <-slow.Done():
	default:
		t.Fatal("slow subscriber not dropped")
	}
	if status.Code(slow.Err()) != codes.ResourceExhausted {
		t.Errorf("drop reason %v, want ResourceExhausted", slow.Err())
	}
	if st := h.Stats(); st.Subscribers != 1 || st.Dropped != 1 {
		t.Errorf("stats %+v", st)
	}
	fast.Close()
	fast.Close() // idempotent
	if st := h.Stats(); st.Subscribers != 0 {
		t.Errorf("stats after close %+v", st)
	}
}

// TestAddGroup: a group added while the hub runs is served like a boot
// group to subscribers of every group and to new subscribers that name it,
// and not to one that listed its groups before it existed.
func TestAddGroup(t *testing.T) {
	src := newTableSource(3) // room for the group added below
	src.set(0, 1)
	src.set(1, 1)
	h := newHub(t, src, 2, 8)
	all, err := h.Subscribe(nil)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := h.Subscribe([]uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	next(t, all)
	next(t, listed)
	if _, err := h.Subscribe([]uint32{2}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("group 2 before it is added: %v, want InvalidArgument", err)
	}
	for _, g := range []int{-1, 1, 3} {
		if err := h.AddGroup(g); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("group %d:", g)) || !strings.Contains(err.Error(), "next one here is 2") {
			t.Errorf("AddGroup(%d) = %v, want an error naming %d and 2", g, err, g)
		}
	}

	src.set(2, 7, "new")
	if err := h.AddGroup(2); err != nil {
		t.Fatal(err)
	}
	if s := h.String(); !strings.Contains(s, "groups: 3") {
		t.Errorf("String() = %q, want 3 groups", s)
	}
	h.Tick(time.Now())
	u := next(t, all)
	if len(u.Groups) != 1 || u.Groups[0].Group != 2 || !u.Groups[0].Full || u.Groups[0].AppliedIndex != 7 || !slices.Equal(u.Groups[0].Added, []string{"new"}) {
		t.Fatalf("first update about group 2: %v, want its full set", u)
	}
	none(t, listed)

	// Its changes, and the heartbeat (forced: an hour later).
	src.set(2, 8, "new", "newer")
	h.Tick(time.Now())
	u = next(t, all)
	if len(u.Groups) != 1 || u.Groups[0].Group != 2 || u.Groups[0].Full || !slices.Equal(u.Groups[0].Added, []string{"newer"}) {
		t.Fatalf("change of group 2: %v", u)
	}
	none(t, listed)
	h.Tick(time.Now().Add(2 * time.Hour))
	if u := next(t, all); !u.Heartbeat || len(u.Groups) != 3 || u.Groups[2].Group != 2 || u.Groups[2].AppliedIndex != 8 {
		t.Fatalf("heartbeat to every group: %v, want groups 0..2", u)
	}
	if u := next(t, listed); !u.Heartbeat || len(u.Groups) != 2 || u.Groups[1].Group != 1 {
		t.Fatalf("heartbeat to groups 0 and 1: %v", u)
	}

	named, err := h.Subscribe([]uint32{2})
	if err != nil {
		t.Fatal(err)
	}
	if u := next(t, named); len(u.Groups) != 1 || u.Groups[0].Group != 2 || !u.Groups[0].Full || !slices.Equal(u.Groups[0].Added, []string{"new", "newer"}) {
		t.Fatalf("full state of group 2: %v", u)
	}
	if u := next(t, mustSubscribe(t, h, nil)); len(u.Groups) != 3 {
		t.Fatalf("full state of every group: %v, want 3 groups", u)
	}
}

func mustSubscribe(t *testing.T, h *Hub, groups []uint32) *Subscription {
	t.Helper()
	s, err := h.Subscribe(groups)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAddGroupWhileRunning: the hub's loop and subscribers come and go while
// groups are added (run with -race); each group added is served.
func TestAddGroupWhileRunning(t *testing.T) {
	const groups = 32
	src := newTableSource(groups)
	for g := range groups {
		src.set(g, uint64(g+1), fmt.Sprintf("t%d", g))
	}
	h, err := New(Config{Groups: 1, Source: src, NodeID: "n1", Period: time.Millisecond, Heartbeat: 5 * time.Millisecond, Buffer: 1024})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { h.Run(ctx) })
	wg.Go(func() {
		for ctx.Err() == nil {
			s, err := h.Subscribe([]uint32{0})
			if err != nil {
				t.Error(err)
				return
			}
			_ = h.String()
			s.Close()
		}
	})
	all := mustSubscribe(t, h, nil)
	for g := 1; g < groups; g++ {
		if err := h.AddGroup(g); err != nil {
			t.Error(err)
			break
		}
		src.set(g, uint64(g+100), fmt.Sprintf("t%d", g))
		time.Sleep(100 * time.Microsecond)
	}
	seen := map[uint32]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < groups && !t.Failed() {
		select {
		case u := <-all.Updates():
			for _, s := range u.Groups {
				if s.Full {
					seen[s.Group] = true
				}
			}
		case <-all.Done():
			t.Fatalf("subscriber dropped: %v", all.Err())
		case <-deadline:
			t.Errorf("full state of %d of %d groups received", len(seen), groups)
		}
	}
}
