package faulttest

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

// Clock tests with fewer than three live clocks: a node's clock counts as
// right only when a majority of the voters' clocks agree with it, so two
// live clocks that disagree confirm neither, and a node that just restarted
// leads nothing until a majority measured it after the restart.

// leaderLines are n's "leadership changed … leader=true" log lines since
// its latest start: raft made it a group's leader (whether or not it then
// ran a session). The log is the whole history, so a leadership shorter
// than any poll interval is still seen.
func leaderLines(t *testing.T, n *node) []string {
	t.Helper()
	data, err := os.ReadFile(n.errPath)
	if err != nil {
		t.Fatalf("read %s's log: %v", n.id, err)
	}
	text := string(data)
	if i := strings.LastIndex(text, "===== faulttest: start #"); i >= 0 {
		text = text[i:]
	}
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "leadership changed") && (strings.Contains(line, "leader=true") || strings.Contains(line, `"leader":true`)) {
			out = append(out, line)
		}
	}
	return out
}

// clockReason is n's /api/v1/status clock: whether it says it may lead,
// and why not ("" and false when it cannot be read).
func clockReason(n *node) (inBound bool, reason string, ok bool) {
	code, body := statusText(n)
	var st struct {
		Clock *struct {
			InBound bool   `json:"in_bound"`
			Reason  string `json:"reason"`
		} `json:"clock"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Clock == nil {
		return false, "", false
	}
	return st.Clock.InBound, st.Clock.Reason, true
}

// resender re-sends a tenant's acknowledged series in rounds and, beside
// them, a fresh batch of new series per round that fills whatever room the
// tenant has: if acknowledged series were ever expired early (a group's time
// jumping ahead), the new ones take their room and the re-sends come back
// rejected.
type resender struct {
	cl     *clientlib.Client
	th     *trackHistory // clients 1 (the re-sends) and 2 (the filler)
	tenant string
	acked  []uint64

	rounds, errs, okRounds atomic.Int64
	rejected               atomic.Int64 // acknowledged series rejected on re-send
	lastErr                atomic.Value
}

func (w *resender) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	wg.Add(1)
	go func() { // the filler: new series, as fast as they are answered
		defer wg.Done()
		for seed := uint64(1000); ; seed++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err := w.th.track(ctx, w.cl, 2, w.tenant, seriesOf(50, seed))
			cancel()
			if err != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		rej, err := w.th.track(ctx, w.cl, 1, w.tenant, w.acked)
		cancel()
		w.rounds.Add(1)
		if err != nil {
			w.errs.Add(1)
			w.lastErr.Store(err.Error())
		} else {
			w.okRounds.Add(1)
			w.rejected.Add(int64(len(rej)))
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// transferTo asks via to hand group g to `to`.
func (c *cluster) transferTo(via, to *node, g int) error {
	ctx, cancel := adminCtx(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.admin(via).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g), ToId: to.id})
	return err
}

// TestClockTwoLiveClocks: node-3's clock is 30 minutes fast. With all three
// up it is refused by the median. Then node-2 is stopped and node-1
// restarted, leaving two live clocks 30 minutes apart: neither is confirmed
// by a majority of the three voters' clocks, so neither may lead (the groups
// are unavailable, which the writer sees as errors, never as rejections),
// and both say why in their status. Once node-2 is back, node-1 or node-2
// leads. Throughout, under a writer that re-sends 800 acknowledged series
// beside new ones that fill the tenant's limit, node-3 never becomes any
// group's leader and no acknowledged re-send is rejected.
//
// On the code before the majority rule, node-3 found itself "within bound"
// of the median of two clocks (the one nearer its own), was elected after
// node-1's restart and stamped its clock on the groups.
//
//	go test -count=1 -run TestClockTwoLiveClocks -v ./faulttest/
func TestClockTwoLiveClocks(t *testing.T) {
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1000, extraArgs: clockArgs("2m"),
		nodeArgs: map[int][]string{2: {"--test-clock-offset", "30m"}}})
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	cl := clockClient(t, c)
	c.mustMoveAll(n1)
	const tenant = "two-clocks"
	// The filler's series are never re-sent: the history (which does not
	// model expiry) holds only because the test ends well within the
	// 2-minute idle timeout.
	th := c.recordTracks(map[string]int{tenant: 1000})
	acked := without(seriesOf(800, 1), th.trackAll(t, cl, tenant, seriesOf(800, 1)))
	if len(acked) != 800 {
		t.Fatalf("%d of 800 series accepted under a limit of 1000", len(acked))
	}
	w := &resender{cl: cl, th: th, tenant: tenant, acked: acked}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go w.run(stop, &wg)
	stopWriter := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriter()
	time.Sleep(3 * time.Second)

	n2.term(t)
	t.Logf("node-2 stopped; leaders %s", c.describe())
	time.Sleep(3 * time.Second)
	n1.term(t)
	// Not ready until a group has a leader: with two disagreeing clocks,
	// not before node-2 is back.
	ready1, err := n1.start()
	if err != nil {
		t.Fatal(err)
	}
	// Two live clocks, 30 minutes apart: hand every group to each in turn
	// (through the other) while they cannot agree.
	// Each must say why it may not lead, naming the other's clock; and
	// neither may be handed a group.
	var why1, why3 string
	saidWhy := false
	accepted := map[int]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		in1, r1, ok1 := clockReason(n1)
		in3, r3, ok3 := clockReason(n3)
		if ok1 && ok3 {
			why1, why3 = r1, r3
			saidWhy = saidWhy || (!in1 && !in3 && strings.Contains(r1, "node-3") && strings.Contains(r3, "node-1"))
		}
		for g := range groups {
			if err := c.transferTo(n1, n3, g); err == nil && !accepted[g] {
				accepted[g] = true
				t.Errorf("group %d: transfer to node-3 (+30m) accepted with two live clocks", g)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("node-1: %s", why1)
	t.Logf("node-3: %s", why3)
	if !saidWhy {
		t.Errorf("with two live clocks 30 minutes apart, node-1 and node-3 did not both say why they may not lead (naming the other)")
	}
	for g := range groups {
		if l, _ := c.leaderOf(g); l == n3 || l == n1 {
			t.Errorf("group %d led by %s while only two clocks 30 minutes apart are live", g, l.id)
		}
	}
	t.Logf("two live clocks for 20 s: writer rounds %d (ok %d, errors %d, last %v), acknowledged re-sends rejected %d",
		w.rounds.Load(), w.okRounds.Load(), w.errs.Load(), w.lastErr.Load(), w.rejected.Load())

	n2.restart(t)
	n1.waitReady(t, ready1)
	c.waitHealthy()
	okBefore := w.okRounds.Load()
	waitUntil(t, "the writer to succeed again with node-2 back", func() bool { return w.okRounds.Load() > okBefore+5 })
	time.Sleep(3 * time.Second)
	stopWriter()
	if rej := th.trackAll(t, cl, tenant, acked); len(rej) != 0 {
		t.Errorf("final re-send: %d of %d acknowledged series rejected", len(rej), len(acked))
	}
	t.Logf("writer: %d rounds (%d ok, %d errors), acknowledged re-sends rejected %d; leaders %s",
		w.rounds.Load(), w.okRounds.Load(), w.errs.Load(), w.rejected.Load(), c.describe())
	if n := w.rejected.Load(); n != 0 {
		t.Errorf("%d acknowledged re-sends were rejected", n)
	}
	if lines := leaderLines(t, n3); len(lines) != 0 {
		t.Errorf("node-3 (+30m) became a group's leader %d times, first: %s", len(lines), lines[0])
	}
	for g, l := range c.leaders() {
		if l == n3 {
			t.Errorf("group %d ends led by node-3 (+30m)", g)
		}
	}
	th.check()
	c.checkNoCrashes()
}

// TestClockRestartedFastNeverLeads: node-1 leads every group and is
// restarted with its clock 30 minutes fast. From the moment its process
// starts, the other nodes are asked every 100 ms to hand it every group:
// each ask must be refused, and node-1 must never become any group's leader
// (its log names every leadership raft gave it). Its peers' samples of its
// clock from before the restart do not count (they drop them when its boot
// changes), and node-1 itself neither asks for votes nor accepts a transfer
// until a majority of clocks confirms its own, which never happens.
//
// On the code before, its peers judged it by its pre-restart samples (kept
// up to 30 s) and the transfers were accepted.
//
//	go test -count=1 -run TestClockRestartedFastNeverLeads -v ./faulttest/
func TestClockRestartedFastNeverLeads(t *testing.T) {
	c := newCluster(t, clusterOptions{defaultMaxSeries: 2000, extraArgs: clockArgs("2m")})
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	cl := clockClient(t, c)
	c.mustMoveAll(n1)
	const tenant = "restart-fast"
	th := c.recordTracks(map[string]int{tenant: 2000})
	acked := without(seriesOf(1000, 1), th.trackAll(t, cl, tenant, seriesOf(1000, 1)))

	n1.term(t)
	c.waitLeader(0, n1)
	n1.args = append(n1.args, "--test-clock-offset", "30m")
	ready, err := n1.start()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	var asks, accepted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, via := range []*node{n2, n3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				for g := range groups {
					select {
					case <-stop:
						return
					default:
					}
					if l, _ := c.leaderOf(g); l != via {
						continue // only the leader can hand the group on
					}
					asks.Add(1)
					if err := c.transferTo(via, n1, g); err == nil {
						accepted.Add(1)
						t.Errorf("%v after node-1's start: %s handed group %d to node-1 (+30m)", time.Since(started).Round(time.Millisecond), via.id, g)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	n1.waitReady(t, ready)
	t.Logf("node-1 (+30m) ready %v after its start", time.Since(started).Round(time.Millisecond))
	waitUntil(t, "node-1's status to say its clock is out of bound", func() bool {
		in, why, ok := clockReason(n1)
		return ok && !in && strings.Contains(why, "out of bound")
	})
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	_, why, _ := clockReason(n1)
	t.Logf("node-1: %s; %d transfers asked, %d accepted", why, asks.Load(), accepted.Load())
	if asks.Load() == 0 {
		t.Error("no transfer to node-1 was asked")
	}
	if lines := leaderLines(t, n1); len(lines) != 0 {
		t.Errorf("node-1 (+30m) became a group's leader %d times after its restart, first: %s", len(lines), lines[0])
	}
	if rej := th.trackAll(t, cl, tenant, acked); len(rej) != 0 {
		t.Errorf("re-send after the restart: %d of %d acknowledged series rejected", len(rej), len(acked))
	}
	th.check()
	c.checkNoCrashes()
}
