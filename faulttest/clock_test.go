package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/faulttest/history"
)

// Clock tests: real processes whose wall clock is shifted with the hidden
// --test-clock-offset flag (their monotonic clock, timers and raft timeouts
// are not), so one node's wrong clock can be tried against admission (minute
// stamping, idle expiry) and metering (slack, dedup windows).

// seriesOf returns count pseudo-random hashes from seed, the same ones
// `tollgate track --count N --seed S` sends.
func seriesOf(count int, seed uint64) []uint64 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]uint64, count)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

// clockClient is a clientlib client in sync mode: every answer is the
// leader's decision.
func clockClient(t *testing.T, c *cluster) *clientlib.Client {
	t.Helper()
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Token: adminToken, Mode: clientlib.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	defer cancel()
	if err := cl.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return cl
}

// without returns hashes minus drop.
func without(hashes, drop []uint64) []uint64 {
	d := map[uint64]bool{}
	for _, h := range drop {
		d[h] = true
	}
	var out []uint64
	for _, h := range hashes {
		if !d[h] {
			out = append(out, h)
		}
	}
	return out
}

// moveAll asks every group's leader to hand leadership to `to` and returns,
// per group, the error (nil: to leads the group now, as far as the call
// says). A node that refuses to lead makes the call fail or the group end
// with another leader; callers decide what they expect.
func (c *cluster) moveAll(to *node) []error {
	errs := make([]error, groups)
	for g := range groups {
		if l, _ := c.leaderOf(g); l == to {
			continue
		}
		via := c.nodes[0]
		if via == to {
			via = c.nodes[1] // ask a node other than the one being promoted
		}
		ctx, cancel := adminCtx(context.Background(), 10*time.Second)
		_, err := c.admin(via).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g), ToId: to.id})
		cancel()
		errs[g] = err
	}
	return errs
}

// mustMoveAll moves every group's leadership to `to` and waits until it
// leads all of them.
func (c *cluster) mustMoveAll(to *node) {
	c.t.Helper()
	deadline := time.Now().Add(leaderTimeout)
	for {
		errs := c.moveAll(to)
		all := true
		for _, l := range c.leaders() {
			all = all && l == to
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("could not move every group's leadership to %s: %v (%s)", to.id, errs, c.describe())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// usageOn is tenant's series in every group as n's replicas hold them (-1:
// no answer).
func usageOn(n *node, tenant string) int64 {
	v := tenantOn(n, tenant)
	if v == nil {
		return -1
	}
	var sum int64
	for _, x := range v.PerGroup {
		sum += x
	}
	return sum
}

// clockArgs are the flags every clock test runs with: leadership stays where
// the test puts it (no balancer).
func clockArgs(idle string, more ...string) []string {
	return append([]string{"--idle-timeout", idle, "--leader-balance-interval", "-1s"}, more...)
}

// TestClockFastLeaderKeepsSeries: node-2's clock is 5 minutes fast. With
// every group led by node-1, a tenant fills its limit (1,000 series, then 150
// more of which 100 fit); then leadership of every group is handed to
// node-2. Whether node-2 leads (group time must not jump) or refuses (its
// clock is out of bound), no acknowledged series may be expired or rejected:
// usage stays at 1,100 and re-sends are all accepted.
//
//	go test -count=1 -run TestClockFastLeaderKeepsSeries -v ./faulttest/
func TestClockFastLeaderKeepsSeries(t *testing.T) {
	for _, mode := range clockModes {
		t.Run(mode.name, func(t *testing.T) { testFastLeaderKeepsSeries(t, mode) })
	}
}

// clockMode: with the default bound (1s) a +5m node is refused leadership;
// with a 10m bound it is allowed to lead, and the group's time must still not
// jump (its wall clock is corrected by its measured offset to the others').
type clockMode struct {
	name  string
	bound string
	leads bool
}

var clockModes = []clockMode{{"refused", "1s", false}, {"leads", "10m", true}}

// moveTo hands every group to n: it must succeed when n may lead; when n
// may not, the refusal is logged and every group must keep a leader other
// than n.
func (c *cluster) moveTo(n *node, mayLead bool) {
	c.t.Helper()
	if mayLead {
		c.mustMoveAll(n)
		c.t.Logf("every group led by %s", n.id)
		return
	}
	errs := c.moveAll(n)
	c.t.Logf("leadership handed to %s: errors %v; leaders now %s", n.id, errs, c.describe())
	time.Sleep(time.Second)
	for g, l := range c.leaders() {
		if l == n {
			c.t.Errorf("group %d is led by %s, whose clock is out of bound", g, n.id)
		}
	}
}

func testFastLeaderKeepsSeries(t *testing.T, mode clockMode) {
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1100, extraArgs: clockArgs("2m", "--max-clock-offset", mode.bound),
		nodeArgs: map[int][]string{1: {"--test-clock-offset", "5m"}}})
	cl := clockClient(t, c)
	c.mustMoveAll(c.nodes[0])
	const tenant = "skew-a"
	th := c.recordTracks(map[string]int{tenant: 1100})
	base := seriesOf(1000, 1)
	if rej := th.trackAll(t, cl, tenant, base); len(rej) != 0 {
		t.Fatalf("first 1000 series: %d rejected under a limit of 1100", len(rej))
	}
	more := seriesOf(150, 2)
	acked := append(append([]uint64(nil), base...), without(more, th.trackAll(t, cl, tenant, more))...)
	if len(acked) != 1100 {
		t.Fatalf("%d series acknowledged, want the limit 1100", len(acked))
	}
	c.moveTo(c.nodes[1], mode.leads)
	time.Sleep(3 * time.Second)
	if u := usageOn(c.nodes[0], tenant); u != 1100 {
		t.Errorf("3 s after node-2 (+5m) was asked to lead: usage %d on node-1, want 1100 (acknowledged series expired)", u)
	}
	third := th.trackAll(t, cl, tenant, seriesOf(150, 3))
	t.Logf("150 new series at the limit: %d rejected", len(third))
	for round := range 2 {
		if rej := th.trackAll(t, cl, tenant, acked); len(rej) != 0 {
			t.Errorf("re-send %d of the %d acknowledged series: %d rejected", round+1, len(acked), len(rej))
		}
	}
	if u := usageOn(c.nodes[0], tenant); u > 1100 {
		t.Errorf("usage %d over the limit 1100", u)
	}
	th.check()
	c.checkNoCrashes()
}

// meterEvent posts one metering event to n and returns the outcome
// ("created", "duplicate") or fails. Every attempt is recorded in hist.
func meterEvent(t *testing.T, hist *history.Recorder, n *node, kind, id string, ts int64) string {
	t.Helper()
	ev := map[string]any{"id": id, "timestamp": ts, "organization_id": "org", "space_id": "space",
		"consumer_id": "c", "resource_id": "postgres", "plan_id": "large", "resource_instance_id": "inst-skew"}
	if kind == "start" {
		ev["measured_usage"] = []map[string]any{{"measure": "memory", "quantity": 512}}
	}
	deadline := time.Now().Add(progressTimeout)
	for {
		var out struct {
			Status string `json:"status"`
		}
		call := hist.Begin(0, history.Op{Kind: history.KindMeterEvent, Key: "inst-skew", ID: id, Time: ts, Stop: kind == "stop"})
		code, body, err := meterHTTP("POST", "http://"+n.httpAddr+"/v1/events/"+kind, ev, nil)
		switch {
		case err == nil && code == http.StatusCreated:
			call.End(history.Op{Outcome: history.OK})
		case err == nil && code < 500:
			call.End(history.Op{Outcome: history.Failed, Err: fmt.Sprintf("%d %s", code, body)})
		case err != nil:
			call.End(history.Op{Outcome: history.Unknown, Err: err.Error()})
		default: // 503 and other 5xx: it may have been applied
			call.End(history.Op{Outcome: history.Unknown, Err: fmt.Sprintf("%d %s", code, body)})
		}
		if err == nil && code == http.StatusCreated {
			if err := json.Unmarshal([]byte(body), &out); err != nil {
				t.Fatalf("%s %s: %v in %s", kind, id, err, body)
			}
			return out.Status
		}
		if err == nil && code != http.StatusServiceUnavailable && code < 500 {
			t.Fatalf("%s %s on %s: %d %s", kind, id, n.id, code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s on %s: not answered: %d %s %v", kind, id, n.id, code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClockMeteringRetryAcrossFastLeader: a start and stop pair is accepted
// through node-1 (slack 3 minutes) and a retry answers duplicate; then node-2,
// whose clock is 5 minutes fast, is asked to lead every group for 5 s, and
// leadership goes back to node-1. The same retry must still answer
// duplicate: a retry of an accepted event never bills twice.
//
//	go test -count=1 -run TestClockMeteringRetryAcrossFastLeader -v ./faulttest/
func TestClockMeteringRetryAcrossFastLeader(t *testing.T) {
	for _, mode := range clockModes {
		t.Run(mode.name, func(t *testing.T) { testMeteringRetryAcrossFastLeader(t, mode) })
	}
}

func testMeteringRetryAcrossFastLeader(t *testing.T, mode clockMode) {
	c := newCluster(t, clusterOptions{extraArgs: clockArgs("2m", "--metering-slack", "3m", "--metering-granularity", "minute", "--max-clock-offset", mode.bound),
		nodeArgs: map[int][]string{1: {"--test-clock-offset", "5m"}}})
	c.mustMoveAll(c.nodes[0])
	// Every attempt, and the final ledger read, checked with the metering
	// model (minute windows).
	hist := c.recordHistory()
	ts := time.Now().UnixMilli() - 20_000
	if got := meterEvent(t, hist, c.nodes[0], "start", "skew-start", ts); got != "created" {
		t.Fatalf("start: %s, want created", got)
	}
	if got := meterEvent(t, hist, c.nodes[0], "stop", "skew-stop", ts+10_000); got != "created" {
		t.Fatalf("stop: %s, want created", got)
	}
	for _, kind := range []string{"start", "stop"} {
		if got := meterEvent(t, hist, c.nodes[0], kind, "skew-"+kind, ts+map[string]int64{"start": 0, "stop": 10_000}[kind]); got != "duplicate" {
			t.Fatalf("immediate retry of %s: %s, want duplicate", kind, got)
		}
	}
	c.moveTo(c.nodes[1], mode.leads)
	time.Sleep(5 * time.Second)
	c.mustMoveAll(c.nodes[0])
	for _, kind := range []string{"start", "stop"} {
		if got := meterEvent(t, hist, c.nodes[0], kind, "skew-"+kind, ts+map[string]int64{"start": 0, "stop": 10_000}[kind]); got != "duplicate" {
			t.Errorf("retry of %s after node-2's leadership: %s, want duplicate (billed twice)", kind, got)
		}
	}
	// The ledger: one 10,000 ms record for the pair, whatever the retries.
	ledger := func() []meterRecord {
		var q struct {
			Records []meterRecord `json:"records"`
		}
		code, body, err := meterHTTP("GET", "http://"+c.nodes[0].httpAddr+"/v1/usage?organization_id=org", nil, &q)
		if err != nil || code != http.StatusOK {
			t.Fatalf("ledger query: %d %s %v", code, body, err)
		}
		var out []meterRecord
		for _, r := range q.Records {
			if r.ResourceInstanceID == "inst-skew" {
				out = append(out, r)
			}
		}
		return out
	}
	waitUntil(t, "the pair's usage record in the ledger", func() bool { return len(ledger()) > 0 })
	time.Sleep(2 * time.Second) // a second record, if any, is written alongside
	readCall := hist.Begin(1, history.Op{Kind: history.KindMeterUsage, Key: "inst-skew"})
	recs := ledger()
	usage := map[int64]int64{}
	for _, r := range recs {
		usage[r.Timestamp/time.Minute.Milliseconds()*time.Minute.Milliseconds()] += r.duration(t)
	}
	readCall.End(history.Op{Outcome: history.OK, Usage: usage})
	var total int64
	ids := map[string]bool{}
	for _, r := range recs {
		if ids[r.UsageID] {
			t.Errorf("usage id %s twice in the ledger", r.UsageID)
		}
		ids[r.UsageID] = true
		total += r.duration(t)
	}
	if total != 10_000 {
		t.Errorf("ledger bills %d ms for one 10,000 ms start/stop pair (%d records): a retry was billed again", total, len(recs))
	}
	c.checkHistory(hist, history.MeteringModel(time.Minute.Milliseconds()))
	c.checkNoCrashes()
}

// statusText runs GET /api/v1/status on n and returns the body.
func statusText(n *node) (int, string) {
	code, body, err := meterHTTP("GET", "http://"+n.httpAddr+"/api/v1/status", nil, nil)
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

// clockOffsets is node n's Clock.Offsets answer.
func (c *cluster) clockOffsets(n *node) (*api.ClockOffsetsResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), adminCallTO)
	defer cancel()
	return api.NewClockClient(c.conn(n.grpcAddr)).Offsets(ctx, &api.ClockOffsetsRequest{})
}

// checkOffsets waits until node-1 measured both peers and checks each offset
// (node-1 minus the peer) against the injected skews, within 50 ms.
func (c *cluster) checkOffsets(skews [3]time.Duration) {
	c.t.Helper()
	var o *api.ClockOffsetsResponse
	// A sample is off by up to half its round trip: one taken while the
	// loaded machine stretched a round trip past 100 ms cannot show the 50 ms
	// bound, so wait for samples with round trips below that (node-1 samples
	// again every probe period); the check below stays at 50 ms.
	waitUntil(c.t, "node-1 to measure both peers' clocks with round trips under 100 ms", func() bool {
		var err error
		o, err = c.clockOffsets(c.nodes[0])
		if err != nil || len(o.Peers) != 2 {
			return false
		}
		for _, p := range o.Peers {
			if (p.AgeNanos == 0 && p.RttNanos == 0) || time.Duration(p.RttNanos) >= 100*time.Millisecond {
				return false
			}
		}
		return true
	})
	for _, p := range o.Peers {
		idx := map[string]int{"node-1": 0, "node-2": 1, "node-3": 2}[p.NodeId]
		want := skews[0] - skews[idx]
		got := time.Duration(p.OffsetNanos)
		c.t.Logf("node-1 measures %s at %v (rtt %v), injected %v", p.NodeId, got, time.Duration(p.RttNanos), want)
		if d := got - want; d > 50*time.Millisecond || d < -50*time.Millisecond {
			c.t.Errorf("node-1's offset to %s is %v, injected %v: off by more than 50 ms", p.NodeId, got, want)
		}
	}
}

// statusCLI runs `tollgate status` against n.
func (c *cluster) statusCLI(n *node) string {
	out, err := exec.Command(c.bin, "status", "--addr", n.grpcAddr, "--token", adminToken, "--timeout", "10s").CombinedOutput()
	if err != nil {
		c.t.Logf("tollgate status: %v", err)
	}
	return string(out)
}

// TestClockExpiryWindow runs the writer of the clock bars on three real
// nodes whose clocks are shifted, while leadership of every group is moved
// to the next node every 15 s: every 15 s a tenant at its limit (1,100)
// offers 50 new series and re-sends every series it had acknowledged, and
// none may be rejected; a second tenant sends 100 series once and abandons
// them: they must expire within [timeout, timeout + 1 min] of that send on
// this test's (correct) clock. Within the bound (+500 ms, −500 ms) no node
// refuses to lead; with node-2 at +5 min (and node-3 300 ms slow, within the
// bound) node-2 never leads and says why in /readyz and status. `tollgate
// status` shows each offset within 50 ms of the injected skew. (Two nodes
// beyond the bound, e.g. +5 min and −5 min, leave no two clocks of three
// within the bound of each other: no node is confirmed and no group has a
// leader, docs/clocks.md.)
//
// The idle timeout is 1m (TOLLGATE_CLOCK_IDLE=2m for the bars' figure); the
// run ends once the abandoned series expired (TOLLGATE_CLOCK_RUN=10m keeps
// the writer and the moves going for 10 minutes).
//
//	go test -count=1 -run TestClockExpiryWindow -v ./faulttest/
func TestClockExpiryWindow(t *testing.T) {
	t.Run("within-bound", func(t *testing.T) {
		testExpiryWindow(t, [3]time.Duration{0, 500 * time.Millisecond, -500 * time.Millisecond}, false)
	})
	t.Run("out-of-bound", func(t *testing.T) {
		testExpiryWindow(t, [3]time.Duration{0, 5 * time.Minute, -300 * time.Millisecond}, true)
	})
}

// beyond: a skew this test treats as out of bound (the bound is 1 s).
func beyond(sk time.Duration) bool { return sk > time.Second || sk < -time.Second }

func testExpiryWindow(t *testing.T, skews [3]time.Duration, skewedRefused bool) {
	idle := 1 * time.Minute
	if v := os.Getenv("TOLLGATE_CLOCK_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d%time.Minute != 0 || d < time.Minute {
			t.Fatalf("TOLLGATE_CLOCK_IDLE=%q: want whole minutes", v)
		}
		idle = d
	}
	nodeArgs := map[int][]string{}
	for i, sk := range skews {
		if sk != 0 {
			nodeArgs[i] = []string{"--test-clock-offset", sk.String()}
		}
	}
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1100, extraArgs: clockArgs(idle.String()), nodeArgs: nodeArgs})
	c.checkOffsets(skews)
	cl := clockClient(t, c)

	// The status surfaces: who is out of bound, and why. A skewed node may
	// have won an election before it measured its peers: it hands the group
	// away within seconds, so this waits for the picture to settle.
	var mismatch string
	deadline := time.Now().Add(progressTimeout)
	for {
		mismatch = ""
		for i, n := range c.nodes {
			code, body := statusText(n)
			var st struct {
				Clock struct {
					InBound bool   `json:"in_bound"`
					Reason  string `json:"reason"`
				} `json:"clock"`
			}
			if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
				t.Fatalf("%s /api/v1/status: %d %.200s", n.id, code, body)
			}
			_, ready, _ := meterHTTP("GET", "http://"+n.httpAddr+"/readyz", nil, nil)
			out := skewedRefused && beyond(skews[i])
			if st.Clock.InBound == out || !strings.HasPrefix(ready, "ready") || out != strings.Contains(ready, "clock out of bound") {
				mismatch += fmt.Sprintf("%s (skew %v): status in_bound=%v reason %q, /readyz %q; want out of bound: %v; ",
					n.id, skews[i], st.Clock.InBound, st.Clock.Reason, strings.TrimSpace(ready), out)
			}
		}
		if mismatch == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if mismatch != "" {
		t.Errorf("status and /readyz: %s", mismatch)
	}
	text := c.statusCLI(c.nodes[0])
	t.Logf("tollgate status (node-1):\n%s", text)
	if skewedRefused != strings.Contains(text, "OUT OF BOUND") {
		t.Errorf("tollgate status names out-of-bound nodes: %v, want %v", !skewedRefused, skewedRefused)
	}

	const live, gone = "clock-live", "clock-abandoned"
	// The abandoned tenant expires on purpose, but it is sent once: the
	// history (which does not model expiry) never sees it again. The live
	// one is re-sent every 15 s, well within the timeout.
	th := c.recordTracks(map[string]int{live: 1100, gone: 1100})
	acked := without(seriesOf(1000, 1), th.trackAll(t, cl, live, seriesOf(1000, 1)))
	if len(acked) != 1000 {
		t.Fatalf("%d of the first 1000 series acknowledged", len(acked))
	}
	sentAt := time.Now()
	if rej := th.trackAll(t, cl, gone, seriesOf(100, 9)); len(rej) != 0 {
		t.Fatalf("abandoned series: %d rejected", len(rej))
	}
	sentDone := time.Now()

	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	var rejected, resends, leadsBySkewed int
	go func() { // the writer
		defer func() { done <- struct{}{} }()
		for round := uint64(0); ; round++ {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Second):
			}
			offer := seriesOf(50, 100+round)
			acked = append(acked, without(offer, th.trackAll(t, cl, live, offer))...)
			rej := th.trackAll(t, cl, live, acked)
			resends++
			rejected += len(rej)
			if len(rej) > 0 {
				t.Errorf("round %d: %d of %d acknowledged series rejected on re-send (leaders %s)", round, len(rej), len(acked), c.describe())
			}
		}
	}()
	go func() { // leadership moves to the next node every 15 s
		defer func() { done <- struct{}{} }()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Second):
			}
			to := c.nodes[i%3]
			errs := c.moveAll(to)
			// raft may still elect a skewed node (elections know nothing of
			// clocks); it must hand the group away at once, without leading
			// it: seen leading the same group 3 s later is a failure.
			first := c.leaders()
			time.Sleep(3 * time.Second)
			for g, l := range c.leaders() {
				if l != nil && l == first[g] && beyond(skews[l.idx]) && skewedRefused {
					leadsBySkewed++
					t.Logf("group %d still led by %s (out of bound) after 3 s", g, l.id)
				}
			}
			t.Logf("move every group to %s: errors %d; leaders %s", to.id, countErrs(errs), c.describe())
		}
	}()

	var expiredAt time.Time
	deadline = sentDone.Add(idle + time.Minute + 30*time.Second)
	for time.Now().Before(deadline) {
		if u := usageOn(c.nodes[0], gone); u == 0 {
			expiredAt = time.Now()
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// TOLLGATE_CLOCK_RUN keeps the writer and the leadership moves going
	// until that long after the abandoned send (the bars' 10 minutes);
	// every re-send round still counts.
	if v := os.Getenv("TOLLGATE_CLOCK_RUN"); v != "" && !expiredAt.IsZero() {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TOLLGATE_CLOCK_RUN=%q: %v", v, err)
		}
		time.Sleep(time.Until(sentDone.Add(d)))
		if u := usageOn(c.nodes[0], gone); u != 0 {
			t.Errorf("abandoned series back: %d active %v after their send", u, time.Since(sentDone).Round(time.Second))
		}
	}
	close(stop)
	<-done
	<-done
	if expiredAt.IsZero() {
		t.Fatalf("abandoned series still held %v after their send (timeout %v)", time.Since(sentDone).Round(time.Second), idle)
	}
	early, late := expiredAt.Sub(sentAt), expiredAt.Sub(sentDone)
	t.Logf("abandoned series expired %v after their send (timeout %v); %d re-send rounds, %d re-sends rejected", late.Round(100*time.Millisecond), idle, resends, rejected)
	if early < idle {
		t.Errorf("abandoned series expired %v after their send: before the %v timeout", early, idle)
	}
	// One minute of whole-minute rounding, plus the poll period and the
	// expire entry's commit.
	if late > idle+time.Minute+3*time.Second {
		t.Errorf("abandoned series expired %v after their send: later than timeout + 1 min (%v)", late, idle+time.Minute)
	}
	if leadsBySkewed > 0 {
		t.Errorf("an out-of-bound node led a group in %d observations", leadsBySkewed)
	}
	if resends == 0 {
		t.Error("the writer never re-sent")
	}
	th.check()
	c.checkNoCrashes()
}

func countErrs(errs []error) int {
	n := 0
	for _, e := range errs {
		if e != nil {
			n++
		}
	}
	return n
}

// TestClockRestartedFastLeader: node-1 leads every group; a tenant holds
// 1,000 acknowledged series and another sends 100 and abandons them. node-1
// is stopped (SIGTERM) and restarted with its clock 30 minutes fast, then
// asked to lead every group: it must refuse (out of bound, named in its
// status), every acknowledged series must be accepted on re-send, and the
// abandoned ones must still expire within [timeout, timeout + 1 min] of
// their send.
//
//	go test -count=1 -run TestClockRestartedFastLeader -v ./faulttest/
func TestClockRestartedFastLeader(t *testing.T) {
	const idle = time.Minute
	c := newCluster(t, clusterOptions{defaultMaxSeries: 1100, extraArgs: clockArgs(idle.String())})
	cl := clockClient(t, c)
	c.mustMoveAll(c.nodes[0])
	const live, gone = "restart-live", "restart-abandoned"
	th := c.recordTracks(map[string]int{live: 1100, gone: 1100}) // gone is sent once: its expiry is outside the history
	acked := without(seriesOf(1000, 1), th.trackAll(t, cl, live, seriesOf(1000, 1)))
	sentAt := time.Now()
	if rej := th.trackAll(t, cl, gone, seriesOf(100, 9)); len(rej) != 0 {
		t.Fatalf("abandoned series: %d rejected", len(rej))
	}
	sentDone := time.Now()

	n1 := c.nodes[0]
	n1.term(t)
	n1.args = append(n1.args, "--test-clock-offset", "30m")
	n1.restart(t)
	c.waitHealthy()
	var refused []error
	waitUntil(t, "node-1 (+30m) to be refused leadership of every group", func() bool {
		refused = c.moveAll(n1)
		for _, err := range refused {
			if status.Code(err) != codes.FailedPrecondition {
				return false
			}
		}
		return true
	})
	t.Logf("asked node-1 (+30m) to lead every group: %v; leaders %s", refused[0], c.describe())
	if !strings.Contains(refused[0].Error(), "may not lead") {
		t.Errorf("refusal does not say why: %v", refused[0])
	}
	for g, l := range c.leaders() {
		if l == n1 {
			t.Errorf("group %d is led by node-1, whose clock is 30 minutes fast", g)
		}
	}
	// The refusal above is the group leaders' measurement of node-1. node-1
	// judges itself against the median of the clocks it measured, which
	// needs both peers' samples: after its restart that can lag the
	// leaders' judgement by a probe round or two (CI saw the status read
	// in that gap once).
	refusedAt := time.Now()
	var body string
	waitUntil(t, "node-1's /api/v1/status to name its clock", func() bool {
		_, body = statusText(n1)
		return strings.Contains(body, "clock out of bound")
	})
	t.Logf("node-1 named its own clock out of bound %v after the leaders refused it", time.Since(refusedAt).Round(time.Millisecond))
	for g, l := range c.leaders() {
		if l == n1 {
			t.Errorf("group %d is led by node-1 once it knows its clock is 30 minutes fast", g)
		}
	}
	if rej := th.trackAll(t, cl, live, acked); len(rej) != 0 {
		t.Errorf("re-send after the restart: %d of %d acknowledged series rejected", len(rej), len(acked))
	}
	var expiredAt time.Time
	for time.Now().Before(sentDone.Add(idle + time.Minute + 30*time.Second)) {
		if u := usageOn(c.nodes[1], gone); u == 0 {
			expiredAt = time.Now()
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if expiredAt.IsZero() {
		t.Fatalf("abandoned series still held %v after their send", time.Since(sentDone).Round(time.Second))
	}
	t.Logf("abandoned series expired %v after their send (timeout %v)", expiredAt.Sub(sentDone).Round(100*time.Millisecond), idle)
	if expiredAt.Sub(sentAt) < idle || expiredAt.Sub(sentDone) > idle+time.Minute+3*time.Second {
		t.Errorf("abandoned series expired %v after their send: outside [%v, %v]", expiredAt.Sub(sentDone), idle, idle+time.Minute)
	}
	if rej := th.trackAll(t, cl, live, acked); len(rej) != 0 {
		t.Errorf("final re-send: %d of %d acknowledged series rejected", len(rej), len(acked))
	}
	th.check()
	c.checkNoCrashes()
}
