package ratelease

import (
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
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
