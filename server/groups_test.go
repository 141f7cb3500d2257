package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/layout"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/recovery"
)

// countFSM counts the commands applied: a state machine for the calls
// refused before one is needed.
type countFSM struct{ n atomic.Int64 }

func (f *countFSM) Apply(*raft.Log) interface{}         { return f.n.Add(1) }
func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return countSnap{}, nil }
func (f *countFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type countSnap struct{}

func (countSnap) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (countSnap) Release()                             {}

// TestAddRaftGroup: a dev node (G = 4) creates raft group 4 on request with
// the empty state machine of a raised group and serves it in place: the
// group elects this node and its leader path takes the leadership, the node
// keeps serving its partitions, and a restart over the data dir that now
// lists 5 groups comes back running 5, group 4 with its full per-group state
// and no partition.
func TestAddRaftGroup(t *testing.T) {
	dir := t.TempDir()
	s, c := startServer(t, dir, nil)
	defer s.Stop(context.Background())
	ctx := context.Background()
	f, err := s.newGroupFSM(4, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.addRaftGroup(ctx, 4, f); err != nil {
		t.Fatal(err)
	}
	if err := s.addRaftGroup(ctx, 4, &countFSM{}); !errors.Is(err, raftnode.ErrGroupExists) {
		t.Fatalf("adding group 4 twice: %v, want ErrGroupExists", err)
	}
	if err := s.addRaftGroup(ctx, 9, &countFSM{}); !errors.Is(err, raftnode.ErrGroupOutOfRange) {
		t.Fatalf("adding group 9 after 4: %v, want ErrGroupOutOfRange", err)
	}
	r := s.host.Raft(4)
	waitFor(t, "group 4 to elect this node and its leader path to take over", func() bool {
		return r.State() == raft.Leader && s.servesGroup(4) && s.trackers[4].leading() && s.trackers[4].ready()
	})
	if s.FSM(4) != f || s.servedGroups() != 5 {
		t.Fatalf("served groups %d, group 4's FSM %p, want 5 and %p", s.servedGroups(), s.FSM(4), f)
	}
	if err := r.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if lo, hi := f.PartitionRange(); lo != hi {
		t.Fatalf("group 4 owns partitions [%d,%d), want none", lo, hi)
	}
	// The boot groups still serve.
	if rej := track(t, c, "t1", 0, hashesIn(1, 0, 5)); len(rej) != 0 {
		t.Fatalf("track after adding a group: %d rejected", len(rej))
	}
	stop(t, s)

	// Restarted with the same flags (groups=4): the listed groups win.
	s2, c2 := startServer(t, dir, nil)
	defer s2.Stop(context.Background())
	if s2.cfg.Layout.Groups != 5 || s2.servedGroups() != 5 || len(s2.servedTrackers()) != 5 || s2.FSM(5) != nil {
		t.Fatalf("restart runs groups=%d, serving %d; want 5", s2.cfg.Layout.Groups, s2.servedGroups())
	}
	if lo, hi := s2.FSM(4).PartitionRange(); lo != hi {
		t.Fatalf("restarted group 4 owns partitions [%d,%d), want none", lo, hi)
	}
	for g := range 4 { // the old groups keep the arithmetic of 4 groups
		lo, hi := s2.FSM(g).PartitionRange()
		if lo != g*16 || hi != (g+1)*16 {
			t.Fatalf("restarted group %d owns [%d,%d), want [%d,%d)", g, lo, hi, g*16, (g+1)*16)
		}
	}
	if got := len(s2.nodeGroups().Groups); got != 5 {
		t.Fatalf("node status lists %d groups, want 5", got)
	}
	// The series tracked before the restart are still there (partition 0
	// stays with group 0), and new ones are admitted.
	if got := s2.FSM(0).Stats().Series; got != 5 {
		t.Fatalf("group 0 holds %d series after the restart, want 5", got)
	}
	if rej := track(t, c2, "t1", 63, hashesIn(2, 63, 5)); len(rej) != 0 {
		t.Fatalf("track after the restart: %d rejected", len(rej))
	}
	stop(t, s2)

	// Naming the raised count is accepted; naming more than the data dir
	// holds is the layout mismatch it always was.
	s3, _ := startServer(t, dir, func(c *Config) { c.Layout.Groups = 5 })
	stop(t, s3)
	cfg := s.cfg
	cfg.Layout.Groups = 6
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "groups=4") || !strings.Contains(err.Error(), "groups=6") {
		t.Fatalf("restart with groups=6 over a data dir created with 4 and raised to 5: %v, want the layout refusal naming both", err)
	}
}

// TestRaiseGroupsDev: a dev node (G = 4) raises its group count to 6 with
// the admin call: groups 4 and 5 are created, elect this node and own no
// partition until the moves hand each its partitions, without a restart;
// the old groups keep serving; raising to 6 again changes nothing, lowering
// is refused; a restart comes back with 6 groups.
func TestRaiseGroupsDev(t *testing.T) {
	dir := t.TempDir()
	s, c := startServer(t, dir, nil)
	defer s.Stop(context.Background())
	ctx := context.Background()
	if rej := track(t, c, "t1", 0, hashesIn(1, 0, 5)); len(rej) != 0 {
		t.Fatalf("track before the raise: %d rejected", len(rej))
	}
	resp, err := s.admin.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: 6})
	if err != nil {
		t.Fatal(err)
	}
	if resp.From != 4 || resp.Groups != 6 || !resp.Changed || resp.Epoch != 1 {
		t.Fatalf("raise 4 → 6: %+v", resp)
	}
	waitFor(t, "groups 4 and 5 to exist and elect this node", func() bool {
		return s.host.Groups() == 6 && s.host.Raft(4).State() == raft.Leader && s.host.Raft(5).State() == raft.Leader
	})
	if tab := s.layout.Module().Current(); tab.Groups != 6 {
		t.Fatalf("table after the raise: %d groups", tab.Groups)
	}
	target := layout.RaiseTarget(64, 4, 6)
	waitFor(t, "the partition moves to finish without a restart", func() bool {
		tab := s.layout.Module().Current()
		for q := range 64 {
			if tab.GroupOf(q) != target[q] {
				return false
			}
		}
		return true
	})
	if got := len(s.nodeGroups().Groups); got != 6 {
		t.Fatalf("node status lists %d groups, want 6", got)
	}
	if rej := track(t, c, "t1", 63, hashesIn(2, 63, 5)); len(rej) != 0 {
		t.Fatalf("track after the raise: %d rejected", len(rej))
	}
	again, err := s.admin.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: 6})
	if err != nil || again.Changed || again.Groups != 6 { // (the moves raised the epoch)
		t.Fatalf("raise 6 → 6: %+v, %v; want no change", again, err)
	}
	_, err = s.admin.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: 5})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "only be raised") {
		t.Fatalf("raise 6 → 5: %v, want InvalidArgument saying the count can only be raised", err)
	}
	_, err = s.admin.RaiseGroups(ctx, &api.RaiseGroupsRequest{To: 65})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("raise to 65 of 64 partitions: %v, want InvalidArgument", err)
	}
	stop(t, s)

	s2, c2 := startServer(t, dir, nil)
	defer s2.Stop(context.Background())
	if s2.cfg.Layout.Groups != 6 || s2.servedGroups() != 6 {
		t.Fatalf("restart runs %d groups, serving %d; want 6", s2.cfg.Layout.Groups, s2.servedGroups())
	}
	if got := s2.layout.Module().Current().Groups; got != 6 {
		t.Fatalf("restarted table: %d groups", got)
	}
	if got := s2.FSM(0).Stats().Series; got != 5 {
		t.Fatalf("group 0 holds %d series after the restart, want 5", got)
	}
	if rej := track(t, c2, "t1", 1, hashesIn(3, 1, 5)); len(rej) != 0 {
		t.Fatalf("track after the restart: %d rejected", len(rej))
	}
	// Recovery (tollgate raft recover) covers the raised groups, with the
	// state machines the restarted node built.
	assertRecoveryFSMsMatch(t, s2)
	stop(t, s2)
	p, err := recovery.Prepare(recovery.Options{DataDir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Groups != 6 || p.Base != 4 || len(p.Plans) != 6 || p.Plans[5].Group != 5 {
		t.Fatalf("recovery plan of a raised data dir: %d groups (base %d), %d plans; want 6 (base 4) and a plan for each group", p.Groups, p.Base, len(p.Plans))
	}
}

// TestRaiseGroupsRefusedWhileAVoterLags: n3 runs an older build, of cluster
// version 5 (it knows the layout table but not layout-raise) or 6 (it
// creates groups but moves no partition online); a raise sent to any node
// is refused with FailedPrecondition naming n3 and the version it supports,
// before it is forwarded to group 0's leader (raiseGate), and nothing
// changes anywhere.
func TestRaiseGroupsRefusedWhileAVoterLags(t *testing.T) {
	for _, old := range []int{5, 6, 7} {
		t.Run(fmt.Sprintf("version %d", old), func(t *testing.T) {
			tc := startCluster(t, 3, func(i int, c *Config) {
				if i == 2 {
					c.Cluster.MaxClusterVersion = old
				}
			})
			for _, n := range tc.nodes {
				waitFor(t, n.cfg.Node.ID+" sees n3's version tag", func() bool {
					for _, m := range n.memberList() {
						if m.ID == "n3" && m.Status == membership.StatusAlive {
							return m.ClusterVersion == old
						}
					}
					return false
				})
			}
			want := fmt.Sprintf("n3 supports cluster version %d", old)
			for _, n := range tc.nodes {
				adm := api.NewAdminClient(dial(t, n.GRPCAddr()))
				_, err := adm.RaiseGroups(adminCtx(t), &api.RaiseGroupsRequest{To: 6})
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
					t.Fatalf("raise sent to %s with an old voter: %v, want FailedPrecondition naming n3", n.cfg.Node.ID, err)
				}
			}
			for _, s := range tc.nodes {
				if s.host.Groups() != 4 || s.layout.Module().Current().Groups != 4 {
					t.Fatalf("%s: %d raft groups, table of %d after a refused raise", s.cfg.Node.ID, s.host.Groups(), s.layout.Module().Current().Groups)
				}
			}
		})
	}
}

// TestNewGroupFSMModulesMatchTheList: a group a raise adds at runtime gets
// its FSM modules from the components' addGroup stage; they must be the
// ones the component list gives any group but 0 at a start, in the same
// order, or its log and snapshots would not replay into the state a
// restarted node builds.
func TestNewGroupFSMModulesMatchTheList(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), nil)
	defer stop(t, s)
	f, err := s.newGroupFSM(s.cfg.Layout.Groups, s.cfg.Layout.Groups+1)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, m := range f.Config().Modules {
		got = append(got, m.Name())
	}
	for _, m := range s.fsmModules(1) {
		want = append(want, m.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("a runtime group's modules %v, the component list's %v", got, want)
	}
}
