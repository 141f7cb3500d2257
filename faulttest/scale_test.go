package faulttest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// scaleTimeout bounds one scaling step (every move of the step, each a
// catch-up of a group's state on a new node). Generous: it catches a
// placement that never settles, it is not a timing assertion.
const scaleTimeout = 4 * time.Minute

// TestScaleOutAndIn grows a cluster under continuous tracking load from 3 to
// 6 to 9 nodes (three zones) and shrinks it back to 3 with `tollgate node
// drain`, all real processes:
//   - after each step every node holds ⌊G·R/N⌋ or ⌈G·R/N⌉ replicas, the
//     voters are where placement wants them, and no node leads two groups
//     more than another;
//   - no group ever has fewer voters than its replicas (a monitor reads every
//     group's configuration from its leader throughout);
//   - the checker sees no acknowledged series rejected and no tenant past
//     its limit, and a snapshot at the end holds every acknowledged series.
func TestScaleOutAndIn(t *testing.T) {
	opts := defaultClusterOptions()
	opts.extraArgs = append(opts.extraArgs, "--move-interval", "1s", "--leader-balance-interval", "2s")
	c := newCluster(t, opts)
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	mon := c.watchQuorum(t)

	first := c.nodes[0]
	grow := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			n := c.newJoiningNode(first, fmt.Sprintf("node-%d", i+1), zones[i%3], first)
			n.startAndWait(t)
			c.nodes = append(c.nodes, n)
			mon.set(c.nodes)
		}
		c.waitPlacementEven(t, fmt.Sprintf("%d → %d nodes", from, to))
		ck.waitProgress(fmt.Sprintf("%d → %d nodes", from, to))
		loadFor(2 * time.Second)
	}
	grow(3, 6)
	grow(6, 9)

	// Scale in: drain the six newest (all at once, as an operator would),
	// wait for each to hold nothing, stop them.
	keep, gone := c.nodes[:3], c.nodes[3:]
	for _, n := range gone {
		if out, err := c.tollgateCLI(time.Minute, "node", "drain", n.id, "--addr", first.grpcAddr); err != nil {
			t.Fatalf("node drain %s: %v\n%s", n.id, err, out)
		}
	}
	for _, n := range gone {
		out, err := c.tollgateCLI(scaleTimeout+30*time.Second, "node", "drain", n.id, "--wait", "--timeout", scaleTimeout.String(), "--addr", first.grpcAddr)
		if err != nil {
			t.Fatalf("node drain %s --wait: %v\n%s", n.id, err, out)
		}
		if !strings.Contains(out, "drained") {
			t.Fatalf("node drain %s --wait ended without saying it is drained:\n%s", n.id, out)
		}
	}
	for _, n := range gone {
		n.term(t)
	}
	c.nodes = slices.Clone(keep)
	mon.set(c.nodes)
	c.waitPlacementEven(t, "9 → 3 nodes")
	c.waitHealthy()
	ck.waitProgress("9 → 3 nodes")
	loadFor(2 * time.Second)
	if out, err := c.tollgateCLI(time.Minute, "status", "--addr", first.grpcAddr); err != nil {
		t.Fatalf("status after scaling in: %v\n%s", err, out)
	}

	minVoters, samples := mon.stop()
	if samples == 0 {
		t.Fatal("the quorum monitor read no configuration")
	}
	if minVoters < 3 {
		t.Fatalf("a group had %d voters at some point (of %d samples, %s): below its replicas", minVoters, samples, mon.lowGroup)
	}
	t.Logf("quorum monitor: %d samples, fewest voters in any group %d", samples, minVoters)
	ck.finish()
	acked := ck.AckedHashes()
	if ex, missing, checked := missingSeries(acked, c.seriesIn(t, first)); missing > 0 {
		t.Fatalf("%d of %d acknowledged series missing after scaling, e.g. %s", missing, checked, strings.Join(ex, ", "))
	} else {
		t.Logf("all %d acknowledged series present after 3 → 6 → 9 → 3 nodes", checked)
	}
}

// status asks the first usable node for Status.
func (c *cluster) status() (*api.StatusResponse, error) {
	var last error
	for _, n := range c.nodes {
		if !n.usable() {
			continue
		}
		ctx, cancel := adminCtx(context.Background(), 5*time.Second)
		st, err := c.admin(n).Status(ctx, &api.StatusRequest{})
		cancel()
		if err == nil {
			return st, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no node answered Status: %v", last)
}

// balanceProblem says why the cluster is not yet balanced ("" when it is):
// every group's leader reported, voters equal placement's target, no
// learner left, each running node holds ⌊G·R/N⌋..⌈G·R/N⌉ replicas and the
// leaderships differ by at most one between nodes.
func (c *cluster) balanceProblem(st *api.StatusResponse) string {
	if len(st.Placement) != groups {
		return fmt.Sprintf("%d of %d groups' leaders reported", len(st.Placement), groups)
	}
	load := map[string]int{}
	for _, gp := range st.Placement {
		if len(gp.Learners) > 0 {
			return fmt.Sprintf("group %d: learners %v", gp.Group, gp.Learners)
		}
		if !slices.Equal(gp.Voters, gp.Target) {
			return fmt.Sprintf("group %d: voters %v, placement wants %v", gp.Group, gp.Voters, gp.Target)
		}
		for _, v := range gp.Voters {
			load[v]++
		}
	}
	n := len(c.nodes)
	lo, hi := groups*3/n, (groups*3+n-1)/n
	led := map[string]int{}
	for _, m := range st.View.Members {
		led[m.Id] = len(m.GroupsLed)
	}
	minLed, maxLed := groups, 0
	for _, nd := range c.nodes {
		if l := load[nd.id]; l < lo || l > hi {
			return fmt.Sprintf("%s holds %d replicas, want %d..%d (%v)", nd.id, l, lo, hi, load)
		}
		minLed, maxLed = min(minLed, led[nd.id]), max(maxLed, led[nd.id])
	}
	if maxLed-minLed > 1 {
		return fmt.Sprintf("leaderships uneven: %v", led)
	}
	return ""
}

// waitPlacementEven waits until balanceProblem finds none, up to scaleTimeout.
func (c *cluster) waitPlacementEven(t *testing.T, when string) {
	t.Helper()
	start := time.Now()
	last := ""
	for {
		st, err := c.status()
		if err != nil {
			last = err.Error()
		} else if last = c.balanceProblem(st); last == "" {
			t.Logf("%s: balanced in %v", when, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > scaleTimeout {
			out, _ := c.tollgateCLI(time.Minute, "status", "--addr", strings.Join(c.grpcAddrs(), ","))
			t.Fatalf("%s: not balanced after %v: %s\n%s", when, scaleTimeout, last, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// quorumMonitor samples every group's voter count from its leader's report.
type quorumMonitor struct {
	done     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	min      int
	samples  int
	lowGroup string
	nodes    []*node // asked each round; set by the test (c.nodes changes)
}

// set replaces the nodes the monitor asks.
func (m *quorumMonitor) set(nodes []*node) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes = slices.Clone(nodes)
}

// watchQuorum starts a monitor; stop returns the fewest voters any group had
// and the number of samples.
func (c *cluster) watchQuorum(t *testing.T) *quorumMonitor {
	m := &quorumMonitor{done: make(chan struct{}), min: 1 << 30, nodes: slices.Clone(c.nodes)}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			select {
			case <-m.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			// Every running node's own report: a leader's configuration
			// is the group's newest.
			m.mu.Lock()
			nodes := slices.Clone(m.nodes)
			m.mu.Unlock()
			for _, n := range nodes {
				ctx, cancel := adminCtx(context.Background(), 2*time.Second)
				ng, err := c.admin(n).NodeGroups(ctx, &api.NodeGroupsRequest{})
				cancel()
				if err != nil {
					continue
				}
				for _, gs := range ng.Groups {
					if gs.RaftState != "Leader" {
						continue
					}
					m.mu.Lock()
					m.samples++
					if len(gs.Voters) < m.min {
						m.min = len(gs.Voters)
						m.lowGroup = fmt.Sprintf("group %d on %s: %v", gs.Group, n.id, gs.Voters)
					}
					m.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { m.stopOnce() })
	return m
}

func (m *quorumMonitor) stopOnce() {
	select {
	case <-m.done:
	default:
		close(m.done)
	}
	m.wg.Wait()
}

func (m *quorumMonitor) stop() (int, int) {
	m.stopOnce()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.min, m.samples
}
