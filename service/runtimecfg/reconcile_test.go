package runtimecfg

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/limits"
)

// The reconciler's tests run two Services, "a" and "b", over a fake cluster:
// one real runtime-config module per group stands for the group's committed
// state (an entry proposed on the group's leader is applied to it at once,
// as raft would after commit on every replica), leadership is a table the
// test moves, and each node reaches the other through real gRPC on loopback
// with the forwarded mark of package forward. It is a fake of raft and the
// server only; the service, the modules and the wire are the real ones.
// Groups can be added while the services run (addGroup), as a raise of the
// group count does on a live node.

type fakeCluster struct {
	mu     sync.Mutex
	mods   []*runtimecfg.Module // grows under mu (addGroup)
	leader []string             // group → node id
	refuse map[int]bool         // groups whose proposals fail (no quorum)
	conns  map[string]*grpc.ClientConn
}

type fakeNode struct {
	c  *fakeCluster
	id string
}

func (n *fakeNode) NodeID() string             { return n.id }
func (n *fakeNode) Base() runtimecfg.Effective { return runtimecfg.Effective{MaxSeries: 100} }
func (n *fakeNode) Fallback() (*runtimecfg.Document, string) {
	return &runtimecfg.Document{}, "no file"
}

func (n *fakeNode) Groups() int {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return len(n.c.mods)
}

func (n *fakeNode) Module(g int) *runtimecfg.Module {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.c.mods[g]
}

func (n *fakeNode) Leads(g int) bool {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.c.leader[g] == n.id
}

func (n *fakeNode) Hosts(int) bool { return true }

func (n *fakeNode) Propose(_ context.Context, g int, typ byte, payload []byte) (any, error) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	if n.c.leader[g] != n.id {
		return nil, status.Errorf(codes.Unavailable, "group %d: not the leader", g)
	}
	if n.c.refuse[g] {
		return nil, status.Errorf(codes.Unavailable, "group %d: no quorum", g)
	}
	return n.c.mods[g].Apply(fsm.ModuleEntry{Type: typ, Payload: payload})
}

func (n *fakeNode) Append(g int, typ byte, payload []byte) (func(context.Context) (any, error), error) {
	return func(ctx context.Context) (any, error) { return n.Propose(ctx, g, typ, payload) }, nil
}

func (n *fakeNode) LeaderConn(ctx context.Context, g int) (*grpc.ClientConn, context.Context, error) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	l := n.c.leader[g]
	if forward.Was(ctx) || l == n.id {
		return nil, nil, errors.New("no leader reachable")
	}
	return n.c.conns[l], forward.Outgoing(ctx), nil
}

func (n *fakeNode) PeerConn(string) (*grpc.ClientConn, error) {
	return nil, errors.New("fake cluster: calls go to a group's leader only")
}

// newFakeCluster starts the two services with group 0 and 1 led by a, 2
// and 3 by b, and their reconcilers running every 20 ms.
func newFakeCluster(t *testing.T) (*fakeCluster, map[string]*Service) {
	t.Helper()
	c := &fakeCluster{leader: []string{"a", "a", "b", "b"}, refuse: map[int]bool{}, conns: map[string]*grpc.ClientConn{}}
	for range 4 {
		c.mods = append(c.mods, runtimecfg.New(nil))
	}
	svcs := map[string]*Service{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, id := range []string{"a", "b"} {
		s, err := New(&fakeNode{c, id}, Options{Logger: slog.New(slog.DiscardHandler), ReconcileEvery: 20 * time.Millisecond, RecheckEvery: 200 * time.Millisecond, ReplicateWait: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		api.RegisterConfigServer(gs, s)
		go gs.Serve(lis)
		t.Cleanup(gs.Stop)
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		c.conns[id] = cc
		svcs[id] = s
		go s.Run(ctx)
	}
	return c, svcs
}

// addGroup adds the next group, led by node leader.
func (c *fakeCluster) addGroup(leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mods = append(c.mods, runtimecfg.New(nil))
	c.leader = append(c.leader, leader)
}

// versions and waitAll read mods without the lock: only the test goroutine
// adds groups.
func (c *fakeCluster) versions() []uint64 {
	out := make([]uint64, len(c.mods))
	for g, m := range c.mods {
		out[g] = m.Current().Version
	}
	return out
}

// waitAll waits until every group holds version v with group 0's content.
func (c *fakeCluster) waitAll(t *testing.T, v uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, m := range c.mods {
			if d := m.Current(); d.Version != v || !runtimecfg.SameContent(d, c.mods[0].Current()) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups at versions %v, want all at %d with group 0's document", c.versions(), v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ptrI(v int64) *int64 { return &v }

// TestReconcilerCopiesChanges: a change made through the node that does not
// lead group 0 is forwarded once, ordered in group 0, and copied into every
// group (those led here directly, the others through their leader) before
// the reply when all answer.
func TestReconcilerCopiesChanges(t *testing.T) {
	c, svcs := newFakeCluster(t)
	resp, err := svcs["b"].SetLimits(context.Background(), &api.SetLimitsRequest{Tenant: "t1", Set: map[string]string{"max_series": "10"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Version != 1 || resp.GroupsAtVersion != 4 {
		t.Fatalf("set answered version %d with %d of 4 groups, want 1 and 4", resp.Version, resp.GroupsAtVersion)
	}
	for g, v := range c.versions() {
		if v != 1 {
			t.Fatalf("group %d at version %d after the reply said all four are at 1", g, v)
		}
	}
	if got := c.mods[3].Current().For("t1", runtimecfg.Effective{}).MaxSeries; got != 10 {
		t.Fatalf("group 3 gives t1 max_series %d, want 10", got)
	}
}

// TestReconcilerCatchesUpAGroup: a group that cannot take the change (no
// quorum) is behind in the reply; once it can, the reconciler on group 0's
// leader copies the change into it without another request.
func TestReconcilerCatchesUpAGroup(t *testing.T) {
	c, svcs := newFakeCluster(t)
	c.mu.Lock()
	c.refuse[3] = true
	c.mu.Unlock()
	resp, err := svcs["a"].ApplyLimits(context.Background(), &api.ApplyLimitsRequest{Config: &api.RuntimeConfig{
		Defaults: &api.TenantLimits{MaxSeries: ptrI(500)}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GroupsAtVersion != 3 {
		t.Fatalf("apply reports %d groups at the version, want 3 (group 3 refuses proposals)", resp.GroupsAtVersion)
	}
	if v := c.mods[3].Current().Version; v != 0 {
		t.Fatalf("group 3 at version %d while it refuses proposals", v)
	}
	c.mu.Lock()
	c.refuse[3] = false
	c.mu.Unlock()
	c.waitAll(t, resp.Version)
}

// TestReconcilerFollowsGroupZerosLeader: when group 0's leadership moves to
// the other node, that node's reconciler takes over the copying.
func TestReconcilerFollowsGroupZerosLeader(t *testing.T) {
	c, svcs := newFakeCluster(t)
	c.mu.Lock()
	c.leader[0] = "b"
	c.refuse[1] = true
	c.mu.Unlock()
	resp, err := svcs["a"].SetLimits(context.Background(), &api.SetLimitsRequest{Defaults: true, Set: map[string]string{"max_series": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.refuse[1] = false
	c.mu.Unlock()
	c.waitAll(t, resp.Version)
}

// TestReconcilerReassertsAfterRestore: a group that holds a version above
// group 0's (group 0 restored from an older backup) makes the reconciler
// re-issue group 0's document under a version above every one seen, so one
// version number never names two documents and every group ends on group
// 0's content.
func TestReconcilerReassertsAfterRestore(t *testing.T) {
	c, svcs := newFakeCluster(t)
	resp, err := svcs["a"].SetLimits(context.Background(), &api.SetLimitsRequest{Tenant: "t1", Set: map[string]string{"max_series": "10"}})
	if err != nil {
		t.Fatal(err)
	}
	c.waitAll(t, resp.Version)
	// Group 2 alone holds a newer document, version 9, that group 0 never
	// ordered (its backup was taken after that change).
	newer := &runtimecfg.Document{Version: 9, Tenants: map[string]runtimecfg.Scope{"t1": {Overrides: limits.Overrides{MaxSeries: ptrI(99)}}}}
	c.mu.Lock()
	if _, err := c.mods[2].Apply(fsm.ModuleEntry{Type: runtimecfg.InstallType(newer), Payload: runtimecfg.AppendInstall(nil, newer)}); err != nil {
		c.mu.Unlock()
		t.Fatal(err)
	}
	c.mu.Unlock()
	svcs["a"].Changed()
	c.waitAll(t, 10)
	if got := c.mods[2].Current().For("t1", runtimecfg.Effective{}).MaxSeries; got != 10 {
		t.Fatalf("group 2 gives t1 max_series %d after the re-assert, want group 0's 10", got)
	}
}

// TestReconcilerServesAddedGroups: groups added while the services run are
// brought to group 0's document by the reconciler, without a change or a
// restart (one led by group 0's leader, one reached through the other
// node), and later changes and reads count them.
func TestReconcilerServesAddedGroups(t *testing.T) {
	c, svcs := newFakeCluster(t)
	resp, err := svcs["a"].SetLimits(context.Background(), &api.SetLimitsRequest{Tenant: "t1", Set: map[string]string{"max_series": "10"}})
	if err != nil {
		t.Fatal(err)
	}
	c.waitAll(t, resp.Version)
	c.addGroup("b")
	c.addGroup("a")
	c.waitAll(t, resp.Version)
	if got := c.mods[4].Current().For("t1", runtimecfg.Effective{}).MaxSeries; got != 10 {
		t.Fatalf("group 4 gives t1 max_series %d, want 10", got)
	}

	resp, err = svcs["b"].SetLimits(context.Background(), &api.SetLimitsRequest{Tenant: "t1", Set: map[string]string{"max_series": "20"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Groups != 6 || resp.GroupsAtVersion != 6 {
		t.Fatalf("set answered %d of %d groups at version %d, want 6 of 6", resp.GroupsAtVersion, resp.Groups, resp.Version)
	}
	get, err := svcs["b"].GetLimits(context.Background(), &api.GetLimitsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(get.GroupVersions) != 6 || get.GroupVersions[4] != resp.Version || get.GroupVersions[5] != resp.Version {
		t.Fatalf("group versions %v, want 6 groups at %d", get.GroupVersions, resp.Version)
	}
}
