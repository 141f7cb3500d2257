package clockbound

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/membership"
)

// fakeNode is a node whose groups all have a raft with 3 voters unless
// voters says otherwise (0: no raft of that group here). Safe for
// concurrent use: the probe loop's calls run beside AddGroup.
type fakeNode struct {
	mu      sync.Mutex
	voters  map[int]int
	leading map[int]bool
	stopped map[int]bool
}

func newFakeNode() *fakeNode {
	return &fakeNode{voters: map[int]int{}, leading: map[int]bool{}, stopped: map[int]bool{}}
}

func (n *fakeNode) Raft(g int) Raft {
	n.mu.Lock()
	defer n.mu.Unlock()
	k, ok := n.voters[g]
	if !ok {
		k = 3
	}
	if k == 0 {
		return nil
	}
	return fakeRaft{voters: k}
}

func (n *fakeNode) Members() []membership.Member { return nil }
func (n *fakeNode) Conn(string) (grpc.ClientConnInterface, error) {
	return nil, ErrNotReady
}

func (n *fakeNode) LeaderSession(g int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leading[g]
}

func (n *fakeNode) StopLeaderSession(g int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.leading[g], n.stopped[g] = false, true
}

func (n *fakeNode) ResumeLeaderSession(int) {}
func (n *fakeNode) Go(f func())             { go f() }

// fakeRaft is a follower whose configuration has voters n1..n<voters>.
type fakeRaft struct{ voters int }

func (r fakeRaft) State() raft.RaftState { return raft.Follower }
func (r fakeRaft) GetConfiguration() raft.ConfigurationFuture {
	var conf raft.Configuration
	for i := 1; i <= r.voters; i++ {
		id := fmt.Sprintf("n%d", i)
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(id)})
	}
	return confFuture{conf}
}
func (r fakeRaft) LeadershipTransfer() raft.Future { return confFuture{} }
func (r fakeRaft) LeadershipTransferToServer(raft.ServerID, raft.ServerAddress) raft.Future {
	return confFuture{}
}

type confFuture struct{ conf raft.Configuration }

func (f confFuture) Error() error                      { return nil }
func (f confFuture) Index() uint64                     { return 0 }
func (f confFuture) Configuration() raft.Configuration { return f.conf }

func newTestClock(t *testing.T, groups int, node Node, now time.Time) *Clock {
	t.Helper()
	c, err := New(Config{NodeID: "n1", Groups: groups, Bound: time.Second, Clock: func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAddGroupNextOnly: groups are added densely, so anything but the next
// one is refused, naming both, and the groups served stay as they were.
func TestAddGroupNextOnly(t *testing.T) {
	c := newTestClock(t, 2, newFakeNode(), time.Now())
	if c.Groups() != 2 {
		t.Fatalf("Groups() = %d, want 2", c.Groups())
	}
	g0, g1 := c.Group(0), c.Group(1)
	for _, g := range []int{-1, 0, 1, 3} {
		err := c.AddGroup(g)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("group %d", g)) || !strings.Contains(err.Error(), "next one here is 2") {
			t.Errorf("AddGroup(%d) = %v, want an error naming %d and 2", g, err, g)
		}
	}
	if c.Groups() != 2 {
		t.Fatalf("Groups() = %d after refused adds, want 2", c.Groups())
	}
	if err := c.AddGroup(2); err != nil {
		t.Fatal(err)
	}
	if c.Groups() != 3 || c.Group(0) != g0 || c.Group(1) != g1 {
		t.Fatalf("after AddGroup(2): %d groups, group 0 kept %v, group 1 kept %v", c.Groups(), c.Group(0) == g0, c.Group(1) == g1)
	}
	if c.Group(2) == nil || c.Group(2) == g1 {
		t.Fatal("group 2 has no clock of its own")
	}
}

// TestAddedGroupLikeBootGroup: an added group's clock follows the node's
// corrected wall clock and its confirmation exactly as a boot group's does.
func TestAddedGroupLikeBootGroup(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	c := newTestClock(t, 1, newFakeNode(), t0)
	if err := c.AddGroup(1); err != nil {
		t.Fatal(err)
	}
	boot, added := c.Group(0), c.Group(1)
	check := func(step string, want int64) {
		t.Helper()
		if b, a := boot.Now(), added.Now(); b != want || a != want {
			t.Fatalf("%s: boot group %d, added group %d, want %d", step, b, a, want)
		}
		if b, a := c.GroupMinute(0), c.GroupMinute(1); b != a {
			t.Fatalf("%s: GroupMinute boot %d, added %d", step, b, a)
		}
	}
	// Nothing applied: the wall clock corrected by the median offset.
	c.mu.Lock()
	c.median = 2 * time.Minute
	c.mu.Unlock()
	check("no entry applied", t0.Add(-2*time.Minute).UnixMilli())
	// An applied entry far ahead: an unconfirmed clock stays on it.
	ahead := t0.Add(10 * time.Minute).UnixMilli()
	boot.Observe(ahead)
	added.Observe(ahead)
	check("entry ahead", ahead)
}

// TestAddedGroupInProbeLoop: the probe loop's voter count and enforcement
// cover a group added after New, and skip one whose raft is not there.
func TestAddedGroupInProbeLoop(t *testing.T) {
	n := newFakeNode()
	c := newTestClock(t, 2, n, time.Now())
	c.Attach()
	n.mu.Lock()
	n.voters[2], n.voters[3] = 5, 0
	n.leading[2] = true
	n.mu.Unlock()
	for g := 2; g <= 3; g++ {
		if err := c.AddGroup(g); err != nil {
			t.Fatal(err)
		}
	}
	voters, ids := c.voterCount()
	if voters != 5 || !ids["n5"] {
		t.Fatalf("voterCount = %d %v, want group 2's 5 voters", voters, ids)
	}
	c.enforce() // not confirmed: no peer measured
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.stopped[2] {
		t.Fatal("the added group's leader session was not stopped while the clock is not confirmed")
	}
}

// TestAddGroupConcurrentReaders: the hot path and the probe loop read the
// groups while AddGroup grows them (run with -race); no group's clock is
// replaced.
func TestAddGroupConcurrentReaders(t *testing.T) {
	c := newTestClock(t, 1, newFakeNode(), time.Now())
	c.Attach()
	first := c.Group(0)
	stop := make(chan struct{})
	var wg, started sync.WaitGroup
	reader := func(read func()) {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			read()
			started.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				read()
			}
		}()
	}
	for range 3 {
		reader(func() {
			last := c.Groups() - 1
			c.Group(last).Observe(time.Now().UnixMilli())
			_ = c.GroupMinute(last)
			if c.Group(0) != first {
				t.Error("group 0's clock was replaced")
			}
		})
	}
	reader(func() { _, _ = c.voterCount(); c.enforce() })
	started.Wait()
	const groups = 64
	for g := 1; g < groups; g++ {
		if err := c.AddGroup(g); err != nil {
			t.Error(err)
			break
		}
		if g%8 == 0 {
			time.Sleep(time.Millisecond) // let the readers see each length
		}
	}
	close(stop)
	wg.Wait()
	if c.Groups() != groups {
		t.Fatalf("Groups() = %d, want %d", c.Groups(), groups)
	}
}
