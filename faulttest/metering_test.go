package faulttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/faulttest/history"
)

// meterRecord is the part of a usage record (ledger answer and sink body)
// this test checks.
type meterRecord struct {
	UsageID            string `json:"usage_id"`
	Group              int    `json:"group"`
	Timestamp          int64  `json:"timestamp"` // the interval's midpoint
	Start              int64  `json:"start"`
	End                int64  `json:"end"`
	ResourceInstanceID string `json:"resource_instance_id"`
	MeasuredUsage      []struct {
		Measure  string  `json:"measure"`
		Quantity float64 `json:"quantity"`
	} `json:"measured_usage"`
}

func (r meterRecord) duration(t *testing.T) int64 {
	for _, m := range r.MeasuredUsage {
		if m.Measure == "duration" {
			return int64(m.Quantity)
		}
	}
	t.Fatalf("record %s has no duration measure", r.UsageID)
	return 0
}

type meterGroupStatus struct {
	Group   int  `json:"group"`
	Leader  bool `json:"leader"`
	Spans   int  `json:"spans"`
	Pending int  `json:"spans_pending"`
	Planned int  `json:"intervals_planned"`
	Records int  `json:"ledger_records"`
}

type meterStatus struct {
	Node   string             `json:"node"`
	NowMs  int64              `json:"now_ms"`
	Groups []meterGroupStatus `json:"groups"`
}

// meterCollector is the HTTP sink: it keeps each usage id once, fails if an
// id comes back with another interval, and is slow enough (a few ms per
// record) that sampling is still posting when the leader is killed.
type meterCollector struct {
	t     *testing.T
	mu    sync.Mutex
	byID  map[string]meterRecord
	posts atomic.Int64
	srv   *httptest.Server
}

func newMeterCollector(t *testing.T) *meterCollector {
	c := &meterCollector{t: t, byID: map[string]meterRecord{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rec meterRecord
		if err := json.NewDecoder(r.Body).Decode(&rec); err != nil || rec.UsageID == "" || r.Header.Get("Idempotency-Key") != rec.UsageID {
			t.Errorf("sink: bad record (%v, key %q)", err, r.Header.Get("Idempotency-Key"))
			http.Error(w, "bad record", http.StatusBadRequest)
			return
		}
		c.posts.Add(1)
		time.Sleep(3 * time.Millisecond)
		c.mu.Lock()
		defer c.mu.Unlock()
		if prev, ok := c.byID[rec.UsageID]; ok && (prev.Start != rec.Start || prev.End != rec.End || prev.ResourceInstanceID != rec.ResourceInstanceID) {
			t.Errorf("sink: usage id %s re-sent with another interval: %+v then %+v", rec.UsageID, prev, rec)
		}
		c.byID[rec.UsageID] = rec
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// meterHTTP is a small JSON client for the nodes' REST API.
func meterHTTP(method, url string, body any, out any) (int, string, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, "", err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, string(b), fmt.Errorf("%s %s: %w", method, url, err)
		}
	}
	return resp.StatusCode, string(b), nil
}

// TestMeteringKillDuringSampling runs continuous-usage metering on three real
// `tollgate server` processes (hour granularity, test clock, an HTTP sink in
// this process). 16 callers send the start and stop events of 2 spans on each
// of 300 targets to random nodes while the clock is advanced an hour at a
// time; in the middle, the leader of a group that holds spans is SIGKILLed
// while its sampler posts records, and later restarted. When every group's
// leader reports nothing left (the status endpoint), the ledger and the sink
// must hold each usage id exactly once, the same set, and per target and hour
// window the durations must sum to the true overlap of the spans.
//
//	go test -count=1 -run TestMeteringKillDuringSampling -v ./faulttest/
func TestMeteringKillDuringSampling(t *testing.T) {
	col := newMeterCollector(t)
	c := newCluster(t, clusterOptions{extraArgs: []string{
		"--metering-test-clock", "--metering-granularity", "hour", "--metering-sink-url", col.srv.URL,
	}})
	const (
		h       = int64(3_600_000)
		targets = 300
		callers = 16
		hours   = 6 // spans lie in [t0, t0+6h)
	)
	// Near the wall clock: a restarted node reads wall time until its clock
	// is set again, and its stamps must stay inside the slack window.
	t0 := time.Now().Truncate(time.Hour).Add(-2 * time.Hour).UnixMilli()
	var clockMu sync.Mutex
	clockAt := t0
	setClock := func(n *node, ms int64) {
		t.Helper()
		set := ms
		code, body, err := meterHTTP("POST", "http://"+n.httpAddr+"/v1/metering/clock", map[string]any{"set_ms": set}, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("clock on %s: %d %s %v", n.id, code, body, err)
		}
	}
	advanceAll := func(d int64) {
		clockMu.Lock()
		defer clockMu.Unlock()
		clockAt += d
		for _, n := range c.nodes {
			if n.usable() {
				setClock(n, clockAt)
			}
		}
	}
	advanceAll(0)

	// Two spans per target at random ms offsets: [a1,b1) then [a2,b2).
	type span struct{ start, end int64 }
	rng := rand.New(rand.NewPCG(1, 2))
	truth := make([][]span, targets)
	for i := range truth {
		var p [4]int64
		for j := range p {
			p[j] = t0 + rng.Int64N(hours*h)
		}
		for a := range p { // sort the four points
			for b := a + 1; b < len(p); b++ {
				if p[b] < p[a] {
					p[a], p[b] = p[b], p[a]
				}
			}
		}
		if p[1] == p[0] {
			p[1]++
		}
		if p[3] <= p[2] || p[2] < p[1] {
			p[2], p[3] = p[1], p[1]+1+rng.Int64N(h)
		}
		truth[i] = []span{{p[0], p[1]}, {p[2], p[3]}}
	}

	// The load: each caller owns targets i%callers and sends their events in
	// order (start, stop, start, stop), to a random live node, retrying with
	// the same id on transport errors and 503 (a retry is a duplicate: 201).
	var sent, retries atomic.Int64
	// Every attempt is recorded (history.jsonl) and, with the final ledger
	// read, checked with the metering model.
	hist := c.recordHistory()
	send := func(client int, kind string, id string, inst int, ts int64, r *rand.Rand) error {
		ev := map[string]any{"id": id, "timestamp": ts, "organization_id": "org", "space_id": "space",
			"consumer_id": "c", "resource_id": "postgres", "plan_id": "large", "resource_instance_id": fmt.Sprint("inst-", inst)}
		if kind == "start" {
			ev["measured_usage"] = []map[string]any{{"measure": "memory", "quantity": 512}}
		}
		deadline := time.Now().Add(progressTimeout)
		for {
			n := c.nodes[r.IntN(len(c.nodes))]
			if n.usable() {
				call := hist.Begin(client, history.Op{Kind: history.KindMeterEvent, Key: fmt.Sprint("inst-", inst), ID: id, Time: ts, Stop: kind == "stop"})
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
					sent.Add(1)
					return nil
				}
				if err == nil && code != http.StatusServiceUnavailable && code < 500 {
					return fmt.Errorf("%s %s on %s: %d %s", kind, id, n.id, code, body)
				}
			}
			retries.Add(1)
			if time.Now().After(deadline) {
				return fmt.Errorf("%s %s: no node accepted it", kind, id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	loadErr := make(chan error, callers)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for sp := range 2 {
				for i := w; i < targets; i += callers {
					s := truth[i][sp]
					if err := send(w, "start", fmt.Sprintf("s%d-%d", i, sp), i, s.start, r); err != nil {
						loadErr <- err
						return
					}
					if err := send(w, "stop", fmt.Sprintf("e%d-%d", i, sp), i, s.end, r); err != nil {
						loadErr <- err
						return
					}
				}
			}
		}()
	}

	// The clock moves an hour at a time under the load; after the third hour
	// the leader of a group with spans is SIGKILLed while its sampler works.
	var victim *node
	for step := 1; step <= hours+2; step++ {
		time.Sleep(400 * time.Millisecond)
		advanceAll(h)
		if step == 3 {
			victim = meterBusyLeader(t, c)
			t.Logf("clock at t0+%dh: SIGKILL %s (leaders: %s), %d events accepted, sink posts %d",
				step, victim.id, c.describe(), sent.Load(), col.posts.Load())
			victim.kill(t)
		}
		if step == 5 {
			victim.restart(t)
			clockMu.Lock()
			setClock(victim, clockAt)
			clockMu.Unlock()
		}
	}
	wg.Wait()
	close(loadErr)
	for err := range loadErr {
		t.Fatal(err)
	}
	advanceAll(2 * h) // every span ends before the clock's last boundary
	t.Logf("load done: %d events accepted, %d retries; waiting for the samplers", sent.Load(), retries.Load())
	waitUntil(t, "every group's sampler to be caught up", func() bool { return meterCaughtUp(c) })

	// The ledger: each usage id once; conservation per target and hour.
	var q struct {
		Records []meterRecord `json:"records"`
	}
	readCall := hist.Begin(callers, history.Op{Kind: history.KindMeterLedger, Key: "ledger"})
	code, body, err := meterHTTP("GET", "http://"+c.nodes[0].httpAddr+"/v1/usage?organization_id=org", nil, &q)
	if err != nil || code != http.StatusOK {
		t.Fatalf("ledger query: %d %s %v", code, body, err)
	}
	readCall.End(history.Op{Outcome: history.OK})
	// One read answers for every instance: record it as one usage read per
	// instance over the same interval.
	readOp := hist.Ops()[len(hist.Ops())-1]
	perInst := map[string]map[int64]int64{}
	for _, r := range q.Records {
		u := perInst[r.ResourceInstanceID]
		if u == nil {
			u = map[int64]int64{}
			perInst[r.ResourceInstanceID] = u
		}
		u[r.Timestamp/h*h] += r.duration(t)
	}
	var reads []history.Op
	for i := range targets {
		key := fmt.Sprint("inst-", i)
		reads = append(reads, history.Op{Client: callers, Kind: history.KindMeterUsage, Key: key, Call: readOp.Call, Return: readOp.Return, Outcome: history.OK, Usage: perInst[key]})
	}
	c.checkHistory(hist, history.MeteringModel(h), reads...)
	ledger := map[string]meterRecord{}
	sums := map[string]int64{}
	for _, r := range q.Records {
		if _, dup := ledger[r.UsageID]; dup {
			t.Errorf("usage id %s twice in the ledger", r.UsageID)
		}
		ledger[r.UsageID] = r
		sums[fmt.Sprint(r.ResourceInstanceID, "@", r.Timestamp/h)] += r.duration(t)
	}
	want := map[string]int64{}
	for i, spans := range truth {
		for _, sp := range spans {
			for w := sp.start / h * h; w < sp.end; w += h {
				if o := min(sp.end, w+h) - max(sp.start, w); o > 0 {
					want[fmt.Sprint("inst-", i, "@", w/h)] += o
				}
			}
		}
	}
	bad := 0
	for k, v := range want {
		if sums[k] != v {
			bad++
			if bad <= 20 {
				t.Errorf("%s: ledger durations sum to %d ms, true overlap %d ms", k, sums[k], v)
			}
		}
	}
	for k, v := range sums {
		if _, ok := want[k]; !ok && v != 0 {
			t.Errorf("%s: ledger durations sum to %d ms where nothing ran", k, v)
		}
	}
	// The sink: exactly the ledger's ids.
	col.mu.Lock()
	sink := col.byID
	col.mu.Unlock()
	for id := range ledger {
		if _, ok := sink[id]; !ok {
			t.Errorf("usage id %s in the ledger, never accepted by the sink", id)
		}
	}
	for id := range sink {
		if _, ok := ledger[id]; !ok {
			t.Errorf("usage id %s at the sink, not in the ledger", id)
		}
	}
	t.Logf("%d targets, %d windows with usage, %d records in the ledger and at the sink (%d posts: %d re-sent)",
		targets, len(want), len(ledger), col.posts.Load(), col.posts.Load()-int64(len(sink)))
	if len(ledger) < len(want) {
		t.Errorf("%d records for %d windows with usage", len(ledger), len(want))
	}
	c.waitHealthy()
	c.checkNoCrashes()
}

// meterBusyLeader returns the node leading a group whose replica holds the
// most spans (the one with work to sample).
func meterBusyLeader(t *testing.T, c *cluster) *node {
	t.Helper()
	var best *node
	most := -1
	for _, n := range c.nodes {
		var st meterStatus
		code, body, err := meterHTTP("GET", "http://"+n.httpAddr+"/v1/metering/status", nil, &st)
		if err != nil || code != http.StatusOK {
			t.Fatalf("status of %s: %d %s %v", n.id, code, body, err)
		}
		for _, g := range st.Groups {
			if g.Leader && g.Spans+g.Planned > most {
				best, most = n, g.Spans+g.Planned
			}
		}
	}
	if best == nil || most <= 0 {
		t.Fatalf("no group leader holds spans")
	}
	return best
}

// meterCaughtUp: every group has a leader reporting no spans (all stopped
// and fully sampled, so removed), nothing pending and nothing planned.
func meterCaughtUp(c *cluster) bool {
	led := map[int]bool{}
	for _, n := range c.nodes {
		var st meterStatus
		code, _, err := meterHTTP("GET", "http://"+n.httpAddr+"/v1/metering/status", nil, &st)
		if err != nil || code != http.StatusOK {
			return false
		}
		for _, g := range st.Groups {
			if !g.Leader {
				continue
			}
			if g.Spans > 0 || g.Pending > 0 || g.Planned > 0 {
				return false
			}
			led[g.Group] = true
		}
	}
	return len(led) == groups
}
