package shares

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/admission"
	"github.com/tollgate-io/tollgate/fsm/shares"
)

// growPort is a node port whose group count a test raises, as the server's
// does once a group's raft and state machine run. It leads every group, so
// the mover's re-drive reads every module below the count.
type growPort struct{ n atomic.Int64 }

func (p *growPort) NodeID() string { return "n1" }
func (p *growPort) Groups() int    { return int(p.n.Load()) }
func (p *growPort) Leads(int) bool { return true }
func (p *growPort) Hosts(int) bool { return true }
func (p *growPort) Propose(context.Context, int, byte, []byte) (any, error) {
	return nil, errors.New("growPort: no raft")
}
func (p *growPort) Append(int, byte, []byte) (func(context.Context) (any, error), error) {
	return nil, errors.New("growPort: no raft")
}
func (p *growPort) LeaderConn(context.Context, int) (*grpc.ClientConn, context.Context, error) {
	return nil, nil, errors.New("growPort: no peers")
}
func (p *growPort) PeerConn(string) (*grpc.ClientConn, error) {
	return nil, errors.New("growPort: no peers")
}

func newGrowNode(t *testing.T, groups, base int) (*Node, *growPort) {
	t.Helper()
	port := &growPort{}
	port.n.Store(int64(groups))
	st, err := NewNode(NodeConfig{
		Port: port, Partitions: 64, Groups: groups, Base: base, Mode: ModeMovable,
		Limit:       func(int, string) (int64, uint64) { return 100, 1 },
		Fixed:       func(int, string) int64 { return 0 },
		Usage:       func(int, string) (int64, int64) { return 0, 0 },
		Exclusive:   func(_ int, fn func() error) error { return fn() },
		VersionGate: func(int, int) Gate { return GateOpen },
		Registerer:  prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, port
}

// TestAddGroup: the next group gets the module a restart would give it
// (same ModuleGroups rule, base share from the created count), the existing
// groups keep theirs, and any other group is refused naming what it asked
// and what the next one is.
func TestAddGroup(t *testing.T) {
	st, _ := newGrowNode(t, 4, 0) // created with 4: Base 0 means Groups
	before := make([]*shares.Module, 4)
	for g := range 4 {
		before[g] = st.Module(g)
	}
	if st.Module(4) != nil || st.FSMModules(4) != nil {
		t.Fatal("group 4 has a module before AddGroup")
	}
	for g := 4; g < 6; g++ {
		if err := st.AddGroup(g); err != nil {
			t.Fatalf("AddGroup(%d): %v", g, err)
		}
	}
	restarted, _ := newGrowNode(t, 6, 4)
	for g := range 6 {
		m := st.Module(g)
		if m == nil || m.Group() != g {
			t.Fatalf("Module(%d) = %v", g, m)
		}
		if fm := st.FSMModules(g); len(fm) != 1 || fm[0] != m {
			t.Fatalf("FSMModules(%d) = %v, want [Module(%d)]", g, fm, g)
		}
		if g < 4 && m != before[g] {
			t.Fatalf("group %d's module was replaced by AddGroup", g)
		}
		for k := range 8 {
			if m.Known(k) != restarted.Module(g).Known(k) {
				t.Fatalf("group %d: Known(%d) = %v, a restarted node's module says otherwise", g, k, m.Known(k))
			}
		}
		if b, rb := st.Base(g, "t"), restarted.Base(g, "t"); b != rb {
			t.Fatalf("group %d: base share %d, a restarted node's %d", g, b, rb)
		}
	}
	if b := st.Base(4, "t"); b != 0 {
		t.Fatalf("a raised group's base share is %d, want 0 (it owns no partition)", b)
	}

	for _, c := range []struct {
		g    int
		want error
	}{{7, ErrGroupOutOfRange}, {-1, ErrGroupOutOfRange}, {5, ErrGroupExists}, {0, ErrGroupExists}} {
		err := st.AddGroup(c.g)
		if !errors.Is(err, c.want) {
			t.Fatalf("AddGroup(%d) = %v, want %v", c.g, err, c.want)
		}
		if !strings.Contains(err.Error(), "group "+strconv.Itoa(c.g)) {
			t.Fatalf("AddGroup(%d): %q does not name the group asked", c.g, err)
		}
	}
	if err := st.AddGroup(7); !strings.Contains(err.Error(), "next one here is 6") {
		t.Fatalf("AddGroup(7): %q does not name the next group (6)", err)
	}
	if st.Module(6) != nil {
		t.Fatal("a refused AddGroup left a module")
	}

	// A group this node has no module for yet reads as empty, not a panic.
	if s := st.Share(9)("t"); s != admission.NoHeadroom {
		t.Fatalf("Share of a group not added: %d, want NoHeadroom (base 0, delta 0)", s)
	}
	if s := st.AdmitShare(9)("t"); s != admission.NoHeadroom {
		t.Fatalf("AdmitShare of a group not added: %d", s)
	}
	if ts := st.TenantShares(9, "t"); ts.Delta != 0 || ts.Group != 9 {
		t.Fatalf("TenantShares of a group not added: %+v", ts)
	}
	if gt := st.moveGate(9); gt != GateUnknown {
		t.Fatalf("moveGate of a group not added: %d", gt)
	}
}

// TestAddGroupWhileReading: readers on other goroutines use every per-group
// accessor, with the count the port reports and beyond it, while groups are
// added one at a time (the port counting each only after AddGroup
// returned). Run with -race: the copy-on-write slice is what keeps it clean.
func TestAddGroupWhileReading(t *testing.T) {
	st, port := newGrowNode(t, 2, 2)
	const last = 200
	var done atomic.Bool
	var wg sync.WaitGroup
	var started sync.WaitGroup
	errs := make(chan string, 4)
	for range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			started.Done()
			for !done.Load() {
				n := port.Groups()
				for g := range n + 2 {
					m := st.Module(g)
					if g < n && m == nil {
						errs <- "Module(" + strconv.Itoa(g) + ") nil below the port's count " + strconv.Itoa(n)
						return
					}
					if m != nil {
						m.Delta("t")
					}
					_ = st.FSMModules(g)
					_ = st.Share(g)("t")
					_ = st.AdmitShare(g)("t")
					_ = st.TenantShares(g, "t")
					_ = st.moveGate(g)
				}
				st.mover.Redrive(context.Background(), 0)
			}
		}()
	}
	started.Wait() // the adds overlap the reads, or -race has nothing to see
	for g := 2; g < last; g++ {
		if err := st.AddGroup(g); err != nil {
			t.Fatalf("AddGroup(%d): %v", g, err)
		}
		port.n.Store(int64(g + 1))
		runtime.Gosched()
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	for g := range last {
		if m := st.Module(g); m == nil || m.Group() != g {
			t.Fatalf("after the adds, Module(%d) = %v", g, m)
		}
	}
}
