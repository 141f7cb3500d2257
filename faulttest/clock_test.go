package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
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
	cl, err := clientlib.New(clientlib.Config{Addrs: c.grpcAddrs(), Mode: clientlib.ModeSync})
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

// trackAll sends hashes for tenant and returns the rejected ones.
func trackAll(t *testing.T, cl *clientlib.Client, tenant string, hashes []uint64) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	defer cancel()
	rej, err := cl.TrackSeries(ctx, tenant, hashes)
	if err != nil {
		t.Fatalf("track %d series of %s: %v", len(hashes), tenant, err)
	}
	return rej
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
		ctx, cancel := adminCtx(context.Background(), 10*time.Second)
		_, err := c.admin(c.nodes[0]).TransferLeadership(ctx, &api.TransferLeadershipRequest{Group: uint32(g), ToId: to.id})
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
	base := seriesOf(1000, 1)
	if rej := trackAll(t, cl, tenant, base); len(rej) != 0 {
		t.Fatalf("first 1000 series: %d rejected under a limit of 1100", len(rej))
	}
	more := seriesOf(150, 2)
	acked := append(append([]uint64(nil), base...), without(more, trackAll(t, cl, tenant, more))...)
	if len(acked) != 1100 {
		t.Fatalf("%d series acknowledged, want the limit 1100", len(acked))
	}
	c.moveTo(c.nodes[1], mode.leads)
	time.Sleep(3 * time.Second)
	if u := usageOn(c.nodes[0], tenant); u != 1100 {
		t.Errorf("3 s after node-2 (+5m) was asked to lead: usage %d on node-1, want 1100 (acknowledged series expired)", u)
	}
	third := trackAll(t, cl, tenant, seriesOf(150, 3))
	t.Logf("150 new series at the limit: %d rejected", len(third))
	for round := range 2 {
		if rej := trackAll(t, cl, tenant, acked); len(rej) != 0 {
			t.Errorf("re-send %d of the %d acknowledged series: %d rejected", round+1, len(acked), len(rej))
		}
	}
	if u := usageOn(c.nodes[0], tenant); u > 1100 {
		t.Errorf("usage %d over the limit 1100", u)
	}
	c.checkNoCrashes()
}

// meterEvent posts one metering event to n and returns the outcome
// ("created", "duplicate") or fails.
func meterEvent(t *testing.T, n *node, kind, id string, ts int64) string {
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
		code, body, err := meterHTTP("POST", "http://"+n.httpAddr+"/v1/events/"+kind, ev, nil)
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
	ts := time.Now().UnixMilli() - 20_000
	if got := meterEvent(t, c.nodes[0], "start", "skew-start", ts); got != "created" {
		t.Fatalf("start: %s, want created", got)
	}
	if got := meterEvent(t, c.nodes[0], "stop", "skew-stop", ts+10_000); got != "created" {
		t.Fatalf("stop: %s, want created", got)
	}
	for _, kind := range []string{"start", "stop"} {
		if got := meterEvent(t, c.nodes[0], kind, "skew-"+kind, ts+map[string]int64{"start": 0, "stop": 10_000}[kind]); got != "duplicate" {
			t.Fatalf("immediate retry of %s: %s, want duplicate", kind, got)
		}
	}
	c.moveTo(c.nodes[1], mode.leads)
	time.Sleep(5 * time.Second)
	c.mustMoveAll(c.nodes[0])
	for _, kind := range []string{"start", "stop"} {
		if got := meterEvent(t, c.nodes[0], kind, "skew-"+kind, ts+map[string]int64{"start": 0, "stop": 10_000}[kind]); got != "duplicate" {
			t.Errorf("retry of %s after node-2's leadership: %s, want duplicate (billed twice)", kind, got)
		}
	}
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

var _ = fmt.Sprint
var _ = os.Getenv
var _ = strings.Contains
