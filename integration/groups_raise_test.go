package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/faulttest/history"
	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// TestRaiseGroupsWhileTracking: a real cluster (P = 64, G = 4) raises its
// group count to 8 while a clientlib client keeps tracking in every
// partition. Groups 4–7 are created empty on every node with the three
// voters placement names; raising to 8 again changes nothing and lowering is
// refused. Every node gives the new groups their per-group state in place,
// without a restart, and group 0's leader hands each old group's upper half
// of partitions to a new group (partition-give / receive / route /
// complete). Throughout, the
// client surfaces no error and its recorded history checks (no series
// acknowledged before, during or after the moves is refused later);
// afterwards every series sent is in its partition's new owner, and every
// node's cluster view carries the final table.
//
// Run with three nodes (one per zone, every node in every group) and with
// four (two in zone-a), where one node holds no replica of group 0, whose
// log carries the table and the raise: that node learns both from group 0's
// leader (service/layouttable Follow), creates the new groups (it may be one
// of their voters) and answers cluster views with the moves' table.
func TestRaiseGroupsWhileTracking(t *testing.T) {
	t.Run("3 nodes", func(t *testing.T) { raiseWhileTracking(t, 3) })
	t.Run("4 nodes, one outside group 0", func(t *testing.T) { raiseWhileTracking(t, 4) })
}

func raiseWhileTracking(t *testing.T, nodes int) {
	const p, from, to = 64, 4, 8
	c := servertest.Start(t, servertest.Options{Nodes: nodes, Configure: func(i int, cfg *server.Config) {
		if i == 3 {
			cfg.Node.Zone = "zone-a"
		}
	}})
	outsiders := 0
	for _, s := range c.Nodes() {
		if !hostsGroup0(t, c, s.NodeID()) {
			outsiders++
		}
	}
	if want := nodes - 3; outsiders != want {
		t.Fatalf("%d nodes hold no replica of group 0, want %d", outsiders, want)
	}
	cl, err := clientlib.New(clientlib.Config{Addrs: c.GRPCAddrs(), Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// A client in auto mode, started before the raise: its near-limit
	// summary streams must come to cover the raised groups (until they do,
	// it tracks their series sync).
	auto, err := clientlib.New(clientlib.Config{Addrs: c.GRPCAddrs(), Mode: clientlib.ModeAuto})
	if err != nil {
		t.Fatal(err)
	}
	defer auto.Close()

	var (
		calls atomic.Int64
		errs  atomic.Int64
		stop  = make(chan struct{})
		done  = make(chan struct{})
		once  sync.Once
	)
	halt := func() { once.Do(func() { close(stop); <-done }) }
	defer halt()
	// Every call is recorded, one operation per partition (the requests
	// clientlib sends), and the history checked at the end: no series
	// acknowledged before, during or after the raise is refused later.
	// Each call re-sends, per partition, a series an earlier call sent.
	rec, err := history.Create(filepath.Join(t.TempDir(), "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var hs []uint64
			ops := make([]*history.Call, p)
			for q := range p {
				lo, _ := api.PartitionHashRange(q, p)
				part := []uint64{lo + i*104729, lo + i/2*104729}
				if i == 0 {
					part = part[:1]
				}
				hs = append(hs, part...)
				ops[q] = rec.Begin(0, history.Op{Kind: history.KindTrack, Key: history.TrackKey("load", q), Hashes: part})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			rej, err := cl.TrackSeries(ctx, "load", hs)
			cancel()
			for q, call := range ops {
				var mine []uint64
				for _, h := range rej {
					if api.Partition(h, p) == q && !slices.Contains(mine, h) {
						mine = append(mine, h)
					}
				}
				call.EndTrack(mine, err)
			}
			calls.Add(1)
			if err != nil {
				errs.Add(1)
				t.Errorf("tracking surfaced an error: %v", err)
			}
		}
	}()
	waitFor(t, "tracking to run", func() bool { return calls.Load() >= 5 })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Any node may be asked: the call is forwarded to group 0's leader.
	var resp *api.RaiseGroupsResponse
	for {
		resp, err = c.Node(1).RaiseGroups(ctx, to)
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("raise %d → %d: %v", from, to, err)
	}
	if resp.From != from || resp.Groups != to || !resp.Changed {
		t.Fatalf("raise %d → %d: %+v", from, to, resp)
	}
	raised := time.Now()
	var why string
	waitFor(t, "every new group on every node, with 3 voters, and in every node's view", func() bool {
		for _, s := range c.Nodes() {
			if s.RaftGroups() != to {
				why = fmt.Sprintf("%s runs %d raft groups", s.NodeID(), s.RaftGroups())
				return false
			}
		}
		for g := from; g < to; g++ {
			// The configuration as the group's leader knows it. A replica
			// removed by a placement move may never hear of its removal
			// and keep the old configuration (four voters) until it is
			// dropped, so the most any node reports says nothing; the
			// leader's is the one that commits.
			voters, leaders := 0, 0
			for _, s := range c.Nodes() {
				r := s.Raft(g)
				if r.State() != raft.Leader {
					continue
				}
				fut := r.GetConfiguration()
				if fut.Error() != nil {
					continue
				}
				leaders++
				voters = 0
				for _, srv := range fut.Configuration().Servers {
					if srv.Suffrage == raft.Voter {
						voters++
					}
				}
			}
			if leaders != 1 {
				why = fmt.Sprintf("group %d: %d leaders", g, leaders)
				return false
			}
			if voters != 3 {
				why = fmt.Sprintf("group %d: %d voters", g, voters)
				return false
			}
		}
		for _, s := range c.Nodes() {
			if tab := viewTable(t, s); tab.Groups != to {
				why = fmt.Sprintf("%s: view's table has %d groups", s.NodeID(), tab.Groups)
				return false
			}
		}
		return true
	}, &why)
	target := layout.RaiseTarget(p, from, to)
	for _, s := range c.Nodes() {
		// The moves may have begun: each partition is at its old owner or
		// its target, nowhere else.
		tab := viewTable(t, s)
		for q := range p {
			if g := tab.GroupOf(q); g != layout.GroupOf(q, p, from) && g != target[q] {
				t.Fatalf("%s: partition %d at group %d, neither its owner before the raise nor its target %d", s.NodeID(), q, g, target[q])
			}
		}
	}
	again, err := c.Node(2).RaiseGroups(ctx, to)
	if err != nil || again.Changed || again.Groups != to {
		t.Fatalf("raise to %d again: %+v, %v; want no change", to, again, err)
	}
	if _, err := c.Node(0).RaiseGroups(ctx, from); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "only be raised") {
		t.Fatalf("lowering to %d: %v, want InvalidArgument", from, err)
	}

	// No restart: every node serves the new groups once it created them,
	// and group 0's leader moves each old group's upper half to a new group
	// (layout.RaiseTarget).
	for _, s := range c.Nodes() {
		waitFor(t, s.NodeID()+" serving every raised group", func() bool { return s.FSM(to-1) != nil })
	}
	moveCtx, moveCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer moveCancel()
	for {
		done := true
		for _, s := range c.Nodes() {
			tab := viewTable(t, s)
			for q := range p {
				done = done && tab.GroupOf(q) == target[q]
			}
		}
		if done {
			break
		}
		if moveCtx.Err() != nil {
			t.Fatalf("partitions not at their target %v after the raise", time.Since(raised))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("32 partitions at their target (in every node's cluster view) %v after the raise, without a restart", time.Since(raised).Round(time.Millisecond))
	waitFor(t, "the auto client's near-limit summaries of every group, the raised ones too", func() bool {
		for g := range to {
			if !auto.NearLimit(g).Known {
				return false
			}
		}
		return true
	})
	// Keep tracking a while on the raised cluster.
	mark := calls.Load()
	waitFor(t, "20 more tracking calls after the moves", func() bool { return calls.Load() >= mark+20 })
	halt()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d errors surfaced to the caller", n)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	if err := history.Check(history.TrackingModel(func(string) int { return 0 }), rec.Ops(), "", time.Minute); err != nil {
		t.Fatalf("tracking across the raise: %v", err)
	}
	t.Logf("history: %d operations checked", len(rec.Ops()))
	st := cl.Stats()
	if st.Errors != 0 || st.FailedOpen != 0 {
		t.Fatalf("client stats: %d errors, %d failed open", st.Errors, st.FailedOpen)
	}
	t.Logf("client: %d Moved answers followed, %d retries", st.Moved, st.Retries)

	// Every series the client sent is in its partition's owner, by the
	// owner's leader; and each group's usage is exactly its series.
	for q := range p {
		g := target[q]
		var l *server.Server
		waitFor(t, fmt.Sprintf("a leader of group %d", g), func() bool { l = c.Leader(g); return l != nil })
		lo, _ := api.PartitionHashRange(q, p)
		n := calls.Load()
		hs := make([]uint64, 0, n)
		for i := range uint64(n) {
			hs = append(hs, lo+i*104729)
		}
		out := make([]uint8, len(hs))
		l.FSM(g).Lookup("load", hs, l.FSM(g).Now(), 21, out)
		for i, st := range out {
			if st == fsm.StateAbsent {
				t.Fatalf("partition %d: series %d not in group %d after the moves", q, i, g)
			}
		}
	}
}

// hostsGroup0 reports whether node id is in group 0's raft configuration.
func hostsGroup0(t *testing.T, c *servertest.Cluster, id string) bool {
	t.Helper()
	fut := c.Node(0).Raft(0).GetConfiguration()
	if err := fut.Error(); err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(fut.Configuration().Servers, func(srv raft.Server) bool { return string(srv.ID) == id })
}

// viewTable is the table node s routes clients by: the layout of the first
// cluster view its WatchCluster stream sends.
func viewTable(t *testing.T, s *server.Server) *layout.Table {
	t.Helper()
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := api.NewTrackerClient(conn).WatchCluster(ctx, &api.WatchClusterRequest{})
	if err != nil {
		t.Fatalf("%s: watch cluster: %v", s.NodeID(), err)
	}
	v, err := st.Recv()
	if err != nil {
		t.Fatalf("%s: watch cluster: %v", s.NodeID(), err)
	}
	tab, err := api.ViewTable(v)
	if err != nil {
		t.Fatalf("%s: cluster view: %v", s.NodeID(), err)
	}
	return tab
}
