package ratelease

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
)

// TestViewNamingANewLeaderEndsItsAvoidance: a node whose stream failed is
// passed over for avoidFor, but once the cluster view names it the new
// leader of a group it is the group's owner again at once; a view that
// still names an avoided node (a dead leader not yet replaced) keeps it
// avoided. The addresses are closed ports on 127.0.0.1: nothing answers,
// and the test drives the view by hand.
func TestViewNamingANewLeaderEndsItsAvoidance(t *testing.T) {
	a, b, c3 := "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	c, err := New(Config{Addrs: []string{a, b, c3}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	view := func(leader string) *api.ClusterView {
		return &api.ClusterView{Partitions: 4, Groups: 1, GroupInfo: []*api.GroupInfo{{Group: 0, LeaderGrpcAddress: leader}}}
	}
	c.applyView(view(a))
	c.mu.Lock()
	until := c.cfg.Now().Add(avoidFor).UnixNano()
	c.avoid[a], c.avoid[c3] = until, until // a died; c3's stream ended while it was a follower
	got := c.usable(0, a)
	c.mu.Unlock()
	if got == a || got == c3 || got == "" {
		t.Fatalf("with %s and %s avoided, group 0 goes to %q, want %s", a, c3, got, b)
	}

	if c.applyView(view(a)) { // the view has not moved on: the dead leader stays avoided
		t.Error("a view naming the same leader reported a moved group")
	}
	c.mu.Lock()
	if c.avoid[a] == 0 {
		t.Errorf("a view still naming the avoided leader %s ended its avoidance", a)
	}
	c.mu.Unlock()

	if !c.applyView(view(c3)) { // c3 won the election
		// (Its watcher then reports to c3 at once, not at the next tick.)
		t.Error("a view naming a new leader did not report the group moved")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if got := c.usable(0, c.leaders[0]); got != c3 {
		t.Errorf("after the view named %s the new leader, group 0 goes to %q, want %s", c3, got, c3)
	}
	if c.avoid[a] == 0 || time.Duration(c.avoid[a]-c.cfg.Now().UnixNano()) > avoidFor {
		t.Errorf("the dead leader %s should stay avoided until its time runs out (avoid %d)", a, c.avoid[a])
	}
}

// TestRoutesRateKeysByTheViewsLayout: once the cluster view carries a layout
// table (a raise moved partitions), a key's reports and asks go to the
// leader of the group the table names, one of the raised groups included;
// without a table, the arithmetic of the view's groups.
func TestRoutesRateKeysByTheViewsLayout(t *testing.T) {
	c, err := New(Config{Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const p = 64
	var infos []*api.GroupInfo
	for g := range 8 {
		infos = append(infos, &api.GroupInfo{Group: uint32(g), LeaderGrpcAddress: fmt.Sprintf("127.0.0.1:%d", 10+g)})
	}
	c.applyView(&api.ClusterView{Partitions: p, Groups: 4, GroupInfo: infos})
	key := "envoy-key-a"
	part := api.RatePartition(key, p)
	c.mu.Lock()
	before := c.groupOf(key)
	c.mu.Unlock()
	if want := api.RateGroup(key, p, 4); before != want {
		t.Fatalf("no layout: group %d, want the arithmetic's %d", before, want)
	}
	// The raise to 8 moved the key's partition to group 6.
	tab := layout.ArithmeticTable(p, 4)
	tab = &layout.Table{Epoch: 3, Groups: 8, Owner: tab.Owner}
	tab = tab.Move(part, 6)
	c.applyView(&api.ClusterView{Partitions: p, Groups: 4, GroupInfo: infos, Layout: api.LayoutToProto(tab)})
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.groupOf(key); g != 6 {
		t.Fatalf("with the key's partition %d moved to group 6: group %d", part, g)
	}
	if got := c.leaders[6]; got != "127.0.0.1:16" {
		t.Errorf("group 6's leader %q, want 127.0.0.1:16 (the view's groups past the created count are kept)", got)
	}
}
