package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/membership"
)

// These tests drive the Controller through its port only. The raft behind
// the port is a FAKE (fakeRaft): a configuration that changes when asked and
// a log index that moves with it, with every call recorded. It stands in for
// what this package cannot run on its own (a raft cluster of several nodes
// and their peers' NodeGroups answers); the same controller runs against real
// raft, gossip and gRPC in server's tests (TestAddVoterLearnerFirst,
// TestRemoveServerKeepsQuorum, TestWipedDiskRejoin in faulttest, …).

// fakeRaft is one group's raft on the leader: its configuration, its log
// index (one entry per configuration change) and the calls made to it.
type fakeRaft struct {
	mu    sync.Mutex
	state raft.RaftState
	conf  raft.Configuration
	index uint64
	calls []string
	// leader is the leader this replica knows (LeaderWithID); a leader
	// knows itself.
	leader raft.ServerID
	// changed is signalled (without blocking) after every configuration
	// change, so a test waits for an outcome instead of for a time.
	changed chan struct{}
}

type fakeFuture struct {
	err   error
	index uint64
	conf  raft.Configuration
}

func (f fakeFuture) Error() error                      { return f.err }
func (f fakeFuture) Index() uint64                     { return f.index }
func (f fakeFuture) Configuration() raft.Configuration { return f.conf }

func newFakeRaft(state raft.RaftState, servers ...raft.Server) *fakeRaft {
	return &fakeRaft{state: state, conf: raft.Configuration{Servers: servers}, index: 10, changed: make(chan struct{}, 64)}
}

func (r *fakeRaft) State() raft.RaftState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

func (r *fakeRaft) GetConfiguration() raft.ConfigurationFuture {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fakeFuture{index: r.index, conf: r.conf.Clone()}
}

// change applies one configuration change as the leader would, recording it.
func (r *fakeRaft) change(call string, edit func(*raft.Configuration) error) raft.IndexFuture {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
	if r.state != raft.Leader {
		return fakeFuture{err: raft.ErrNotLeader}
	}
	if err := edit(&r.conf); err != nil {
		return fakeFuture{err: err}
	}
	r.index++
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return fakeFuture{index: r.index}
}

func (r *fakeRaft) AddNonvoter(id raft.ServerID, addr raft.ServerAddress, _ uint64, _ time.Duration) raft.IndexFuture {
	return r.change(fmt.Sprintf("AddNonvoter %s %s", id, addr), func(c *raft.Configuration) error {
		for i, s := range c.Servers {
			if s.ID == id {
				c.Servers[i].Address = addr // raft keeps a voter's suffrage
				return nil
			}
		}
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Nonvoter, ID: id, Address: addr})
		return nil
	})
}

func (r *fakeRaft) AddVoter(id raft.ServerID, addr raft.ServerAddress, _ uint64, _ time.Duration) raft.IndexFuture {
	return r.change(fmt.Sprintf("AddVoter %s %s", id, addr), func(c *raft.Configuration) error {
		for i, s := range c.Servers {
			if s.ID == id {
				c.Servers[i] = raft.Server{Suffrage: raft.Voter, ID: id, Address: addr}
				return nil
			}
		}
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: id, Address: addr})
		return nil
	})
}

func (r *fakeRaft) RemoveServer(id raft.ServerID, _ uint64, _ time.Duration) raft.IndexFuture {
	return r.change(fmt.Sprintf("RemoveServer %s", id), func(c *raft.Configuration) error {
		n := len(c.Servers)
		c.Servers = slices.DeleteFunc(c.Servers, func(s raft.Server) bool { return s.ID == id })
		if len(c.Servers) == n {
			return fmt.Errorf("%s not in the configuration", id)
		}
		return nil
	})
}

func (r *fakeRaft) LeadershipTransfer() raft.Future {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "LeadershipTransfer")
	return fakeFuture{}
}

func (r *fakeRaft) LeadershipTransferToServer(id raft.ServerID, _ raft.ServerAddress) raft.Future {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("LeadershipTransferToServer %s", id))
	return fakeFuture{}
}

func (r *fakeRaft) LeaderWithID() (raft.ServerAddress, raft.ServerID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == raft.Leader {
		return "self", "self"
	}
	return raft.ServerAddress(r.leader), r.leader
}

func (r *fakeRaft) LastIndex() uint64   { r.mu.Lock(); defer r.mu.Unlock(); return r.index }
func (r *fakeRaft) CommitIndex() uint64 { r.mu.Lock(); defer r.mu.Unlock(); return r.index }

func (r *fakeRaft) callLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *fakeRaft) server(id string) (raft.Server, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.conf.Servers {
		if string(s.ID) == id {
			return s, true
		}
	}
	return raft.Server{}, false
}

// fakeNode is the port of node self: its groups' rafts, the members gossip
// lists, and every peer's answer to NodeGroups, derived from the leader's
// fake raft (a peer in the configuration follows self with the whole log,
// unless lagging says otherwise).
type fakeNode struct {
	self    string
	rafts   []*fakeRaft
	mu      sync.Mutex
	members []membership.Member
	lagging map[string]bool // peers whose log stays behind
	cid     string
	// answer, when set, is every peer's NodeGroups answer instead.
	answer func(grpcAddr string) *api.NodeGroupsResponse
}

func (n *fakeNode) Raft(g int) Raft { return n.rafts[g] }
func (n *fakeNode) Members() []membership.Member {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.members)
}
func (n *fakeNode) Gossip() bool                                           { return true }
func (n *fakeNode) ProbeRaft(int, raft.ServerAddress, time.Duration) error { return nil }
func (n *fakeNode) GroupHasState(int) (bool, error)                        { return true, nil }
func (n *fakeNode) BootstrapGroup(int, []raft.Server) error                { return raft.ErrCantBootstrap }
func (n *fakeNode) ClusterID() string                                      { return n.cid }
func (n *fakeNode) SetClusterID(cid, _ string)                             { n.cid = cid }
func (n *fakeNode) MayLead(string) string                                  { return "" }

func (n *fakeNode) PeerGroups(_ context.Context, grpcAddr string) (*api.NodeGroupsResponse, error) {
	if n.answer != nil {
		if out := n.answer(grpcAddr); out != nil {
			return out, nil
		}
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	var m *membership.Member
	for _, x := range n.Members() {
		if x.GRPCAddr == grpcAddr && x.Status == membership.StatusAlive {
			m = &x
		}
	}
	if m == nil {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	out := &api.NodeGroupsResponse{NodeId: m.ID, RaftAddr: m.RaftAddr}
	for g, r := range n.rafts {
		gs := &api.GroupState{Group: uint32(g), RaftState: "None"}
		if srv, ok := r.server(m.ID); ok && string(srv.Address) == m.RaftAddr {
			gs.RaftState, gs.LeaderId = raft.Follower.String(), n.self
			gs.LastIndex, gs.AppliedIndex = r.LastIndex(), r.LastIndex()
			if n.lagging[m.ID] {
				gs.LastIndex, gs.AppliedIndex = 1, 1
			}
		}
		out.Groups = append(out.Groups, gs)
	}
	return out, nil
}

func member(id, zone string) membership.Member {
	return membership.Member{ID: id, Zone: zone, GRPCAddr: id + ":9090", RaftAddr: id + ":7301", Status: membership.StatusAlive}
}

func voter(m membership.Member) raft.Server {
	return raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.RaftAddr)}
}

// newTestController is node n1's controller over one group it leads.
func newTestController(t *testing.T, members []membership.Member, voters ...raft.Server) (*Controller, *fakeNode, *fakeRaft, chan struct{}, *sync.WaitGroup) {
	t.Helper()
	r := newFakeRaft(raft.Leader, voters...)
	node := &fakeNode{self: "n1", rafts: []*fakeRaft{r}, members: members, lagging: map[string]bool{}, cid: "c1"}
	closing := make(chan struct{})
	var wg sync.WaitGroup
	c := New(Config{NodeID: "n1", Zone: "a", Groups: 1, Replicas: 3, Closing: closing, WG: &wg}, node)
	t.Cleanup(func() {
		select {
		case <-closing:
		default:
			close(closing)
		}
		wg.Wait()
	})
	return c, node, r, closing, &wg
}

// inOrder reports whether every call of want appears in calls, in that order.
func inOrder(calls []string, want ...string) bool {
	i := 0
	for _, c := range calls {
		if i < len(want) && c == want[i] {
			i++
		}
	}
	return i == len(want)
}

// A member joins a zone without a voter: the leader adds it as a non-voter,
// promotes it once its own replica reports the log, and only then counts it.
func TestControllerJoin(t *testing.T) {
	n1, n2, n3 := member("n1", "a"), member("n2", "b"), member("n3", "c")
	c, node, r, _, wg := newTestController(t, []membership.Member{n1, n2}, voter(n1), voter(n2))

	c.Place(time.Now()) // n1 and n2 are new to the controller: nothing to add
	wg.Wait()
	if calls := r.callLog(); len(calls) != 0 {
		t.Fatalf("two voters in two zones, nobody else: the controller changed %v", calls)
	}

	node.mu.Lock()
	node.members = append(node.members, n3)
	node.mu.Unlock()
	c.Place(time.Now()) // n3 became alive: reconcile
	wg.Wait()
	srv, ok := r.server("n3")
	if !ok || srv.Suffrage != raft.Voter || srv.Address != "n3:7301" {
		t.Fatalf("after n3 joined zone c: n3 is %+v (in configuration: %v), want a voter at n3:7301; calls %v", srv, ok, r.callLog())
	}
	if calls := r.callLog(); !inOrder(calls, "AddNonvoter n3 n3:7301", "AddVoter n3 n3:7301") || len(calls) != 2 {
		t.Fatalf("calls %v: want a non-voter first, then its promotion, nothing else", calls)
	}
}

// A joiner that does not catch up is not promoted: the operator's add-voter
// fails naming the reason, and the non-voter is removed again.
func TestControllerLearnerThatLagsIsNotPromoted(t *testing.T) {
	n1, n2, n3 := member("n1", "a"), member("n2", "b"), member("n3", "c")
	c, node, r, _, _ := newTestController(t, []membership.Member{n1, n2, n3}, voter(n1), voter(n2))
	node.lagging["n3"] = true
	_, err := c.AddLearner(context.Background(), LearnerRequest{Group: 0, ID: "n3", CatchUp: time.Nanosecond})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "did not catch up") {
		t.Fatalf("add-voter of a lagging n3: %v, want FailedPrecondition naming the catch-up", err)
	}
	if _, ok := r.server("n3"); ok {
		t.Fatalf("a learner that did not catch up stayed in the configuration; calls %v", r.callLog())
	}
	if calls := r.callLog(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "AddVoter") }) {
		t.Fatalf("a lagging learner was promoted: %v", calls)
	}
}

// A node's data dir was wiped: it comes back under its id with a new
// incarnation. The leader removes the earlier incarnation (n2 and n1 are an
// up-to-date quorum without it), adds the new one as a non-voter and
// promotes it once caught up.
func TestControllerWipeReplacesIncarnation(t *testing.T) {
	n1, n2 := member("n1", "a"), member("n2", "b")
	old := member("n3", "c")
	old.RaftAddr += "#inc1"
	wiped := member("n3", "c")
	wiped.Incarnation, wiped.RaftAddr = "inc2", "n3:7301#inc2"
	c, _, r, closing, wg := newTestController(t, []membership.Member{n1, n2, wiped}, voter(n1), voter(n2), voter(old))

	wg.Add(1)
	go func() { defer wg.Done(); c.RunIncarnations() }()
	for {
		srv, _ := r.server("n3")
		if srv.Suffrage == raft.Voter && srv.Address == "n3:7301#inc2" {
			break
		}
		<-r.changed // bounded by the test's timeout
	}
	close(closing)
	wg.Wait()
	want := []string{"RemoveServer n3", "AddNonvoter n3 n3:7301#inc2", "AddVoter n3 n3:7301#inc2"}
	if calls := r.callLog(); !slices.Equal(calls, want) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
}

// The earlier incarnation is not removed while the voters left would not
// include an up-to-date quorum: n2 is down, so n1 alone would remain.
func TestControllerWipeWaitsForQuorum(t *testing.T) {
	n1, n2 := member("n1", "a"), member("n2", "b")
	old := member("n3", "c")
	old.RaftAddr += "#inc1"
	wiped := member("n3", "c")
	wiped.Incarnation, wiped.RaftAddr = "inc2", "n3:7301#inc2"
	down := n2
	down.Status = membership.StatusFailed
	c, _, r, _, _ := newTestController(t, []membership.Member{n1, down, wiped}, voter(n1), voter(n2), voter(old))

	conf := r.GetConfiguration().Configuration()
	ok, why := c.quorumUpToDateWithout(0, "n3", conf)
	if ok || !strings.Contains(why, "n2 (down or replaced)") {
		t.Fatalf("quorum without n3 while n2 is down: %v (%q), want refused naming n2", ok, why)
	}
	c.replaceIncarnation(0, voter(old), wiped, conf)
	if calls := r.callLog(); len(calls) != 0 {
		t.Fatalf("replaced the earlier incarnation without an up-to-date quorum: %v", calls)
	}
}

// An operator's removal that would leave fewer running voters than a quorum
// is refused; the same removal once the down voter is back is allowed.
func TestControllerRemovalThatLosesQuorumRefused(t *testing.T) {
	n1, n2, n3 := member("n1", "a"), member("n2", "b"), member("n3", "c")
	down := n3
	down.Status = membership.StatusFailed
	c, node, _, _, _ := newTestController(t, []membership.Member{n1, n2, down}, voter(n1), voter(n2), voter(n3))
	peers := []*api.Peer{
		{Id: "n1", Suffrage: raft.Voter.String()}, {Id: "n2", Suffrage: raft.Voter.String()}, {Id: "n3", Suffrage: raft.Voter.String()},
	}
	err := c.RemovalKeepsQuorum(0, peers, "n2")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "down: n3") {
		t.Fatalf("removing n2 while n3 is down: %v, want FailedPrecondition naming n3", err)
	}
	if err := c.RemovalKeepsQuorum(0, peers, "n3"); err != nil {
		t.Fatalf("removing the down n3 leaves n1 and n2 running: %v", err)
	}
	node.mu.Lock()
	node.members[2] = n3
	node.mu.Unlock()
	if err := c.RemovalKeepsQuorum(0, peers, "n2"); err != nil {
		t.Fatalf("removing n2 with n3 back: %v", err)
	}
}

// A drained node's replica moves: the leader adds placement's choice in the
// same zone through the learner path, and only then removes the drained voter,
// so the group never has fewer than three voters.
func TestControllerMoveOffDrainedNode(t *testing.T) {
	n1, n2, n3, n5 := member("n1", "a"), member("n2", "b"), member("n3", "c"), member("n5", "b")
	drained := n2
	drained.Decommissioning = true
	c, _, r, _, wg := newTestController(t, []membership.Member{n1, drained, n3, n5}, voter(n1), voter(n2), voter(n3))

	c.Place(time.Now()) // every member new: reconcile, which adds nothing (each zone has a voter)
	wg.Wait()
	if calls := r.callLog(); len(calls) != 0 {
		t.Fatalf("reconcile changed a whole group: %v", calls)
	}
	c.Place(time.Now().Add(time.Hour)) // past learnerResume: the move
	wg.Wait()
	want := []string{"AddNonvoter n5 n5:7301", "AddVoter n5 n5:7301", "RemoveServer n2"}
	if calls := r.callLog(); !slices.Equal(calls, want) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	var voters []string
	for _, s := range r.GetConfiguration().Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		}
	}
	if slices.Sort(voters); !slices.Equal(voters, []string{"n1", "n3", "n5"}) {
		t.Fatalf("voters after the move %v, want n1 n3 n5", voters)
	}
}

// A controller whose node no longer leads the group changes nothing.
func TestControllerFollowerChangesNothing(t *testing.T) {
	n1, n2, n3 := member("n1", "a"), member("n2", "b"), member("n3", "c")
	c, _, r, _, wg := newTestController(t, []membership.Member{n1, n2, n3}, voter(n1), voter(n2))
	r.mu.Lock()
	r.state = raft.Follower
	r.mu.Unlock()
	c.Place(time.Now())
	c.Place(time.Now().Add(time.Hour))
	wg.Wait()
	if calls := r.callLog(); len(calls) != 0 {
		t.Fatalf("a follower changed the configuration: %v", calls)
	}
	_, err := c.AddLearner(context.Background(), LearnerRequest{Group: 0, ID: "n3"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("add-voter on a follower: %v, want Unavailable", err)
	}
}

// TestControllerStaleReplica: n1's replica of group 0 still names n1, n2 and
// n3 but knows no leader: n2, which gossips that it leads group 0, was asked
// and its configuration (n2, n3, n4) does not name n1, so the replica is
// marked removed — after it knew no leader for staleAfter, not before — and
// unmarked once it hears from a leader again. A leader whose configuration
// names n1, or a peer that does not lead the group, marks nothing.
func TestControllerStaleReplica(t *testing.T) {
	n1, n2, n3, n4 := member("n1", "a"), member("n2", "b"), member("n3", "c"), member("n4", "a")
	n2.GroupsLed = []int{0}
	r := newFakeRaft(raft.Follower, voter(n1), voter(n2), voter(n3))
	voters := []string{"n2", "n3", "n4"}
	state := raft.Leader.String()
	node := &fakeNode{self: "n1", rafts: []*fakeRaft{r}, members: []membership.Member{n1, n2, n3, n4}, lagging: map[string]bool{}, cid: "c1",
		answer: func(addr string) *api.NodeGroupsResponse {
			if addr != n2.GRPCAddr {
				return nil
			}
			return &api.NodeGroupsResponse{NodeId: "n2", Groups: []*api.GroupState{{Group: 0, RaftState: state, Voters: voters}}}
		}}
	closing := make(chan struct{})
	defer close(closing)
	var wg sync.WaitGroup
	c := New(Config{NodeID: "n1", Zone: "a", Groups: 1, Replicas: 3, Closing: closing, WG: &wg, DisableAutoPlace: true}, node)
	t0 := time.Now()
	place := func(at time.Duration) bool {
		c.Place(t0.Add(at))
		wg.Wait()
		return c.Removed(0)
	}
	if place(0) || place(staleAfter-time.Second) {
		t.Fatal("marked removed before it knew no leader for staleAfter")
	}
	if !place(staleAfter) {
		t.Fatal("not marked removed: the leader's configuration does not name this node")
	}
	r.mu.Lock()
	r.leader = "n2"
	r.mu.Unlock()
	if place(staleAfter + time.Second) {
		t.Fatal("still marked removed after hearing from a leader")
	}
	// Again leaderless, but now the leader names n1 (it was re-added), or the
	// peer asked does not lead the group: nothing is marked.
	r.mu.Lock()
	r.leader = ""
	r.mu.Unlock()
	voters = []string{"n1", "n2", "n3"}
	at := 2*staleAfter + time.Second
	place(at)
	if place(at+staleAfter) || place(at+2*staleAfter) {
		t.Fatal("marked removed while the leader's configuration names this node")
	}
	voters, state = []string{"n2", "n3", "n4"}, raft.Follower.String()
	if place(at+3*staleAfter) || place(at+4*staleAfter) {
		t.Fatal("marked removed on the word of a peer that does not lead the group")
	}
}

// A voter that came back on a new raft address while this node was not yet
// its group's leader (or while the first re-add failed) is re-added at the
// new address by the periodic repair: the controller saw the member become
// alive already, so reconcileAll does not run for it again, and a voter left
// at its old address would never hear from the leader.
func TestControllerReaddsMovedVoterLater(t *testing.T) {
	n1, n2, n3 := member("n1", "a"), member("n2", "b"), member("n3", "c")
	c, node, r, _, wg := newTestController(t, []membership.Member{n1, n2, n3}, voter(n1), voter(n2), voter(n3))
	r.mu.Lock()
	r.state = raft.Follower
	r.mu.Unlock()
	t0 := time.Now()
	c.Place(t0) // every member new to the controller: reconcile, but n1 leads nothing
	wg.Wait()
	node.mu.Lock()
	node.members[2].RaftAddr = "n3:7302" // n3 restarted on another port
	node.mu.Unlock()
	c.Place(t0.Add(time.Second)) // still nothing led here
	wg.Wait()
	r.mu.Lock()
	r.state = raft.Leader // leadership arrives; n3 stays alive throughout
	r.mu.Unlock()
	c.Place(t0.Add(2*time.Second + learnerResume))
	wg.Wait()
	if srv, ok := r.server("n3"); !ok || srv.Address != "n3:7302" || srv.Suffrage != raft.Voter {
		t.Fatalf("n3 is %+v (in configuration: %v), want a voter at its new address n3:7302; calls %v", srv, ok, r.callLog())
	}
	calls := r.callLog()
	c.Place(t0.Add(3*time.Second + 2*learnerResume))
	wg.Wait()
	if again := r.callLog(); len(again) != len(calls) {
		t.Fatalf("a voter at its gossiped address was re-added again: %v", again[len(calls):])
	}
}

// A learner that placement no longer wants (a move interrupted by a
// leadership change left it, and placement has chosen another node since)
// is removed by the periodic repair once it stayed unwanted for strayAfter,
// not before; a learner placement wants is promoted, never removed.
func TestControllerDropsStrayLearner(t *testing.T) {
	n1, n2, n3, n4, n5 := member("n1", "a"), member("n2", "b"), member("n3", "c"), member("n4", "a"), member("n5", "a")
	members := []membership.Member{n1, n2, n3, n4, n5}
	target := PlaceAll(1, placementCandidates(members), 3)[0]
	wanted := func(id string) bool {
		return slices.ContainsFunc(target, func(m membership.Member) bool { return m.ID == id })
	}
	stray := n4
	if wanted("n4") {
		stray = n5
	}
	if wanted(stray.ID) {
		t.Fatalf("placement wants both n4 and n5: %v", target)
	}
	learner := raft.Server{Suffrage: raft.Nonvoter, ID: raft.ServerID(stray.ID), Address: raft.ServerAddress(stray.RaftAddr)}
	r := newFakeRaft(raft.Leader, voter(n1), voter(n2), voter(n3), learner)
	node := &fakeNode{self: "n1", rafts: []*fakeRaft{r}, members: members, lagging: map[string]bool{}, cid: "c1"}
	closing := make(chan struct{})
	defer close(closing)
	var wg sync.WaitGroup
	c := New(Config{NodeID: "n1", Zone: "a", Groups: 1, Replicas: 3, Closing: closing, WG: &wg, MoveInterval: -1}, node)
	t0 := time.Now()
	place := func(at time.Duration) bool {
		c.Place(t0.Add(at))
		wg.Wait()
		_, ok := r.server(stray.ID)
		return ok
	}
	if !place(0) { // every member new: reconcile, which removes no learner
		t.Fatalf("%s removed by the reconcile; calls %v", stray.ID, r.callLog())
	}
	at := learnerResume + time.Second
	if !place(at) || !place(at+strayAfter/2) {
		t.Fatalf("%s removed before it stayed unwanted for %v; calls %v", stray.ID, strayAfter, r.callLog())
	}
	if place(at + strayAfter + 2*learnerResume) {
		t.Fatalf("%s, a learner placement does not want (target %v), still in the configuration; calls %v", stray.ID, target, r.callLog())
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		if srv, ok := r.server(id); !ok || srv.Suffrage != raft.Voter {
			t.Fatalf("voter %s touched: %+v, %v", id, srv, ok)
		}
	}
}
