package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	climeter "github.com/tollgate-io/tollgate/clientlib/metering"
	"github.com/tollgate-io/tollgate/metering/interval"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
	"github.com/tollgate-io/tollgate/service/metering"
)

// collector is an HTTP sink that keeps each usage id once and can be told to
// answer some ids with errors first.
type collector struct {
	mu      sync.Mutex
	byID    map[string]metering.RecordDoc
	posts   map[string]int
	script  func(id string, attempt int, rec metering.RecordDoc) (code int, retryAfter string)
	srv     *httptest.Server
	refused map[string]bool
}

func newCollector(t *testing.T) *collector {
	c := &collector{byID: map[string]metering.RecordDoc{}, posts: map[string]int{}, refused: map[string]bool{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rec metering.RecordDoc
		if err := json.NewDecoder(r.Body).Decode(&rec); err != nil || r.Header.Get("Idempotency-Key") != rec.UsageID {
			http.Error(w, "bad record", http.StatusTeapot)
			return
		}
		c.mu.Lock()
		c.posts[rec.UsageID]++
		attempt := c.posts[rec.UsageID]
		script := c.script
		c.mu.Unlock()
		if script != nil {
			if code, ra := script(rec.UsageID, attempt, rec); code != 0 {
				if ra != "" {
					w.Header().Set("Retry-After", ra)
				}
				if code >= 400 && code < 500 && code != 429 {
					c.mu.Lock()
					c.refused[rec.UsageID] = true
					c.mu.Unlock()
				}
				http.Error(w, "scripted", code)
				return
			}
		}
		c.mu.Lock()
		if prev, ok := c.byID[rec.UsageID]; ok && (prev.Start != rec.Start || prev.End != rec.End) {
			c.mu.Unlock()
			t.Errorf("usage id %s re-sent with another interval", rec.UsageID)
			http.Error(w, "conflict", http.StatusConflict)
			return
		}
		c.byID[rec.UsageID] = rec
		c.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) records() map[string]metering.RecordDoc {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]metering.RecordDoc{}
	for k, v := range c.byID {
		out[k] = v
	}
	return out
}

// cluster is a servertest cluster with the metering helpers below; nodes is
// every node in start order.
type cluster struct {
	t     testing.TB
	nodes []*server.Server
}

// startCluster starts n in-process nodes on loopback (servertest) with HTTP
// on, warnings logged and metering at hour granularity sending to sinkURL;
// opts adjust each node's configuration after that. With -short (make
// test-fast) a test asking for more than one node is skipped by servertest:
// elections and failovers take seconds each, so the fast loop leaves every
// cluster test to make test.
func startCluster(t testing.TB, n int, sinkURL string, testClock bool, opts ...func(*server.Config)) *cluster {
	t.Helper()
	sc := servertest.Start(t, servertest.Options{Nodes: n, Configure: func(_ int, cfg *server.Config) {
		cfg.Node.HTTPAddr = "127.0.0.1:0"
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cfg.Metering = metering.Config{Granularity: interval.Hour, SinkURL: sinkURL, TestClock: testClock, MaxBody: 4096}
		if _, bench := t.(*testing.B); bench {
			cfg.Logger = slog.New(slog.DiscardHandler)
			cfg.Cluster.LeaderBalanceInterval = -1 // leaders stay where the election put them
		}
		for _, o := range opts {
			o(cfg)
		}
	}})
	return &cluster{t: t, nodes: sc.Nodes()}
}

func (c *cluster) setClock(ms int64) {
	for _, s := range c.nodes {
		if err := s.Metering().Clock().Set(ms); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *cluster) advance(d time.Duration) {
	for _, s := range c.nodes {
		if err := s.Metering().Clock().Advance(d); err != nil {
			c.t.Fatal(err)
		}
	}
}

// idle waits until every group's leader reports nothing pending.
func (c *cluster) idle() {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second) // catches hangs only
	for {
		busy := ""
		leaders := 0
		for _, s := range c.nodes {
			for _, g := range s.Metering().Status().Groups {
				if g.Leader {
					leaders++
					if g.Pending > 0 || g.Planned > 0 {
						busy = fmt.Sprintf("%s group %d: %+v", s.NodeID(), g.Group, g)
					}
				}
			}
		}
		if busy == "" && leaders >= 4 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("sampler not idle: %s (leaders %d)", busy, leaders)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func post(t *testing.T, url, ctype, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, ctype, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postRetry retries 503 (no leader known during a leadership change), as a
// client does.
func postRetry(t *testing.T, url, ctype, body string) (int, string) {
	t.Helper()
	for range 200 {
		code, b := post(t, url, ctype, body)
		if code != http.StatusServiceUnavailable {
			return code, b
		}
		time.Sleep(25 * time.Millisecond)
	}
	return post(t, url, ctype, body)
}

func doc(id string, ts int64, inst string, measures bool) string {
	m := map[string]any{"id": id, "timestamp": ts, "organization_id": "org", "space_id": "space", "consumer_id": "c",
		"resource_id": "postgres", "plan_id": "large", "resource_instance_id": inst}
	if measures {
		m["measured_usage"] = []map[string]any{{"measure": "memory", "quantity": 512}}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestStatusCodesOverHTTP sends every kind of event to every node of a real
// three-node cluster (followers forward to the group's leader) and checks
// each status code of the API.
func TestStatusCodesOverHTTP(t *testing.T) {
	c := startCluster(t, 3, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC).UnixMilli()
	c.setClock(now)
	for i, s := range c.nodes {
		base := "http://" + s.HTTPAddr()
		inst := fmt.Sprint("inst-", i)
		steps := []struct {
			name, path, ctype, body string
			want                    int
			contains                string
		}{
			{"start", "start", "application/json", doc("s-"+inst, now-1000, inst, true), 201, "created"},
			{"duplicate start", "start", "application/json", doc("s-"+inst, now-1000, inst, true), 201, "duplicate"},
			{"second start", "start", "application/json", doc("s2-"+inst, now, inst, true), 409, "active span"},
			{"id reused", "start", "application/json", doc("s-"+inst, now-999, inst, true), 409, "already used"},
			{"stop without span", "stop", "application/json", doc("e-none", now, inst+"-none", false), 422, "no active span"},
			{"stop before start", "stop", "application/json", doc("e0-"+inst, now-2000, inst, false), 422, "before"},
			{"outside slack", "start", "application/json", doc("old-"+inst, now-63*24*3600*1000, inst+"-old", true), 422, "slack"},
			{"future outside slack", "start", "application/json", doc("new-"+inst, now+63*24*3600*1000, inst+"-new", true), 422, "slack"},
			{"missing field", "start", "application/json", `{"id":"x","timestamp":1,"space_id":"s"}`, 400, "organization_id"},
			{"missing timestamp", "start", "application/json", `{"id":"x","space_id":"s"}`, 400, "timestamp"},
			{"missing target field", "start", "application/json", strings.Replace(doc("m", now, inst, true), `"plan_id":"large",`, "", 1), 400, "plan_id"},
			{"wrong type", "start", "application/json", strings.Replace(doc("w", now, inst, true), `"timestamp":`, `"timestamp":"x",`+`"ignored":`, 1), 400, ""},
			{"string timestamp", "start", "application/json", `{"timestamp":"now"}`, 400, "timestamp"},
			{"unknown field", "start", "application/json", `{"timestamp":1,"colour":"red"}`, 400, "colour"},
			{"no measures on start", "start", "application/json", doc("nm", now, inst+"-nm", false), 400, "measured_usage"},
			{"measures on stop", "stop", "application/json", doc("ms", now, inst, true), 400, "measured_usage"},
			{"not JSON content type", "start", "text/plain", doc("t", now, inst, true), 415, "JSON"},
			{"body not JSON", "start", "application/json", `<xml/>`, 415, "not JSON"},
			{"too large", "start", "application/json", `{"id":"` + strings.Repeat("a", 5000) + `"}`, 413, "exceeds"},
			{"stop", "stop", "application/json", doc("e-"+inst, now+5000, inst, false), 201, "created"},
			{"duplicate stop", "stop", "application/json", doc("e-"+inst, now+5000, inst, false), 201, "duplicate"},
			{"conflicting stop (id reused)", "stop", "application/json", doc("e-"+inst, now+6000, inst, false), 409, "already used"},
			{"second stop", "stop", "application/json", doc("e2-"+inst, now+6000, inst, false), 422, "no active span"},
		}
		for _, st := range steps {
			code, body := postRetry(t, base+"/v1/events/"+st.path, st.ctype, st.body)
			if code != st.want || !strings.Contains(body, st.contains) {
				t.Errorf("%s via %s: %d %s, want %d containing %q", st.name, s.NodeID(), code, body, st.want, st.contains)
			}
		}
	}
	// The clock is refused on a node not started in test mode (409: the
	// node's mode refuses, not the caller's credentials).
	c1 := startCluster(t, 1, "", false)
	code, body := post(t, "http://"+c1.nodes[0].HTTPAddr()+"/v1/metering/clock", "application/json", `{"advance_ms":1000}`)
	if code != http.StatusConflict || !strings.Contains(body, "--metering-test-clock") {
		t.Fatalf("clock on a production node: %d %s", code, body)
	}
	code, _ = post(t, "http://"+c.nodes[0].HTTPAddr()+"/v1/metering/clock", "application/json", `{"advance_ms":1000}`)
	if code != http.StatusOK {
		t.Fatalf("clock in test mode: %d", code)
	}
}

// TestClockAdmin: the test clock over gRPC (Metering.SetClock through the Go
// client) and REST on nodes with an admin token: refused without the
// token, refused with FailedPrecondition / 409 naming the flag on a node
// not started with the test clock, applied on one that is.
func TestClockAdmin(t *testing.T) {
	const token = "s3cret"
	withToken := func(cfg *server.Config) { cfg.Access.AdminToken = token }
	test := startCluster(t, 1, "", true, withToken).nodes[0]
	prod := startCluster(t, 1, "", false, withToken).nodes[0]
	client := func(s *server.Server) *climeter.Client {
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return climeter.New(cc)
	}
	ctx := context.Background()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	wrong := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer nope")
	t0 := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC)

	tc := client(test)
	for name, cctx := range map[string]context.Context{"no token": ctx, "wrong token": wrong} {
		if _, err := tc.SetClock(cctx, &t0, 0); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
			t.Fatalf("SetClock with %s: %v, want Unauthenticated", name, err)
		}
	}
	if now := test.Metering().Clock().Now(); now == t0.UnixMilli() {
		t.Fatal("refused SetClock changed the clock")
	}
	clk, err := tc.SetClock(admin, &t0, 0)
	if err != nil || !clk.Now.Equal(t0) || !clk.TestClock || test.Metering().Clock().Now() != t0.UnixMilli() {
		t.Fatalf("set: %+v %v (clock %d)", clk, err, test.Metering().Clock().Now())
	}
	clk, err = tc.SetClock(admin, nil, 90*time.Minute)
	if want := t0.Add(90 * time.Minute); err != nil || !clk.Now.Equal(want) || test.Metering().Clock().Now() != want.UnixMilli() {
		t.Fatalf("advance: %+v %v", clk, err)
	}
	if _, err := tc.SetClock(admin, nil, -time.Minute); status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("negative advance: %v", err)
	}

	pc := client(prod)
	before := prod.Metering().Clock().Now()
	_, err = pc.SetClock(admin, &t0, time.Hour)
	if !errors.Is(err, climeter.ErrClockLocked) || !strings.Contains(err.Error(), "--metering-test-clock") {
		t.Fatalf("SetClock on a node without the test clock: %v", err)
	}
	if prod.Metering().Clock().Now() < before || prod.Metering().Clock().Now() == t0.UnixMilli() {
		t.Fatal("the refused SetClock changed the clock")
	}
	if clk, err := pc.SetClock(admin, nil, 0); err != nil || clk.TestClock || clk.Now.UnixMilli() < before {
		t.Fatalf("reading the clock of a node without the test clock: %+v %v", clk, err)
	}
	if _, err := pc.SetClock(ctx, nil, 0); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Fatalf("reading without the token: %v", err)
	}

	// REST: the same admin rule and refusals.
	clockPost := func(s *server.Server, auth, body string) (int, string) {
		req, err := http.NewRequest("POST", "http://"+s.HTTPAddr()+"/v1/metering/clock", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := clockPost(test, "", `{"advance_ms":1000}`); code != http.StatusUnauthorized {
		t.Fatalf("REST clock without the token: %d %s", code, body)
	}
	if code, body := clockPost(test, token, `{"advance_ms":1000}`); code != http.StatusOK || !strings.Contains(body, fmt.Sprint(t0.Add(90*time.Minute+time.Second).UnixMilli())) {
		t.Fatalf("REST clock: %d %s", code, body)
	}
	if code, body := clockPost(prod, token, `{"set_ms":1}`); code != http.StatusConflict || !strings.Contains(body, "--metering-test-clock") {
		t.Fatalf("REST clock on a node without the test clock: %d %s", code, body)
	}
}

// TestGRPCClient checks the Go client against a real node: the same rules as
// REST, as errors.
func TestGRPCClient(t *testing.T) {
	c := startCluster(t, 1, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC)
	c.setClock(now.UnixMilli())
	cc, err := grpc.NewClient(c.nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := climeter.New(cc)
	ctx := context.Background()
	tg := climeter.Target{OrganizationID: "o", SpaceID: "s", ConsumerID: "c", ResourceID: "r", PlanID: "p", ResourceInstanceID: "i"}
	ev := climeter.Event{ID: "a", Timestamp: now, Target: tg, Measures: map[string]float64{"memory": 1}}
	if r, err := cl.Start(ctx, ev); err != nil || r.Duplicate {
		t.Fatalf("start: %+v %v", r, err)
	}
	if r, err := cl.Start(ctx, ev); err != nil || !r.Duplicate {
		t.Fatalf("retry: %+v %v", r, err)
	}
	ev.ID = "b"
	if _, err := cl.Start(ctx, ev); !errorsIs(err, climeter.ErrConflict) {
		t.Fatalf("second start: %v", err)
	}
	if _, err := cl.Stop(ctx, climeter.Event{ID: "x", Timestamp: now.Add(-time.Hour), Target: tg}); !errorsIs(err, climeter.ErrUnprocessable) {
		t.Fatalf("stop before start: %v", err)
	}
	if _, err := cl.Start(ctx, climeter.Event{Timestamp: now, Target: climeter.Target{OrganizationID: "o"}}); !errorsIs(err, climeter.ErrInvalid) {
		t.Fatalf("invalid: %v", err)
	}
	if _, err := cl.Stop(ctx, climeter.Event{ID: "e", Timestamp: now.Add(90 * time.Minute), Target: tg}); err != nil {
		t.Fatal(err)
	}
	c.advance(3 * time.Hour)
	c.idle()
	recs, err := cl.Query(ctx, tg, time.Time{}, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, r := range recs {
		sum += r.MeasuredUsage[len(r.MeasuredUsage)-1].Quantity
	}
	if len(recs) != 2 || sum != float64(90*time.Minute/time.Millisecond) {
		t.Fatalf("records %v sum %v", recs, sum)
	}
}

func errorsIs(err, target error) bool {
	return err != nil && strings.Contains(err.Error(), target.Error())
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

// TestSamplingSinksAndFailover runs spans through a real cluster with the
// HTTP sink answering 429 (Retry-After), 503 and 400 for some records, moves
// every group's leadership in the middle of sampling, and checks afterwards:
// conservation per target and hour, each usage id once in the ledger and at
// the sink, the 400s visible as dead letters.
func TestSamplingSinksAndFailover(t *testing.T) {
	col := newCollector(t)
	col.script = func(id string, attempt int, rec metering.RecordDoc) (int, string) {
		switch {
		case rec.ResourceInstanceID == "dead":
			return 400, ""
		case strings.HasSuffix(id, "-1") && attempt == 1:
			return 429, "1"
		case strings.HasSuffix(id, "-2") && attempt <= 2:
			return 503, ""
		}
		return 0, ""
	}
	c := startCluster(t, 3, col.srv.URL, true)
	h := int64(3_600_000)
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).UnixMilli()
	c.setClock(t0 + 5*h)
	base := "http://" + c.nodes[0].HTTPAddr()
	type span struct{ start, end int64 }
	truth := map[string]span{}
	for i := range 24 {
		inst := fmt.Sprint("i", i)
		if i == 23 {
			inst = "dead"
		}
		st := t0 + int64(i)*h/7
		if code, b := postRetry(t, base+"/v1/events/start", "application/json", doc("s"+inst, st, inst, true)); code != 201 {
			t.Fatalf("start: %d %s", code, b)
		}
		truth[inst] = span{st, 0}
	}
	c.idle() // sampled up to t0+5h, forward
	// Move every group's leadership while sinks retry.
	for g := range 4 {
		for _, s := range c.nodes {
			if s.Raft(g).State() == raft.Leader {
				_ = s.Raft(g).LeadershipTransfer().Error()
			}
		}
	}
	for i := range 24 {
		inst := fmt.Sprint("i", i)
		if i == 23 {
			inst = "dead"
		}
		end := truth[inst].start + int64(i%5)*h/3 // mostly late stops: negative sampling
		if code, b := postRetry(t, base+"/v1/events/stop", "application/json", doc("e"+inst, end, inst, false)); code != 201 {
			t.Fatalf("stop: %d %s", code, b)
		}
		truth[inst] = span{truth[inst].start, end}
	}
	c.advance(2 * time.Hour)
	c.idle()
	var q struct {
		Records []metering.RecordDoc `json:"records"`
	}
	getJSON(t, base+"/v1/usage?organization_id=org", &q)
	sums := map[string]int64{}
	ids := map[string]bool{}
	for _, r := range q.Records {
		if ids[r.UsageID] {
			t.Fatalf("usage id %s twice in the ledger", r.UsageID)
		}
		ids[r.UsageID] = true
		d := int64(r.MeasuredUsage[len(r.MeasuredUsage)-1].Quantity)
		sums[fmt.Sprint(r.ResourceInstanceID, "@", r.Timestamp/h)] += d
	}
	want := map[string]int64{}
	for inst, sp := range truth {
		for w := sp.start / h * h; w < sp.end; w += h {
			if o := min(sp.end, w+h) - max(sp.start, w); o > 0 {
				want[fmt.Sprint(inst, "@", w/h)] += o
			}
		}
	}
	for k, v := range want {
		if sums[k] != v {
			t.Errorf("%s: ledger sum %d, overlap %d", k, sums[k], v)
		}
	}
	for k, v := range sums {
		if want[k] != v {
			t.Errorf("%s: ledger sum %d where there was no usage", k, v)
		}
	}
	sink := col.records()
	for id, r := range ids {
		_ = r
		rec := findRecord(q.Records, id)
		if rec.ResourceInstanceID == "dead" {
			if _, ok := sink[id]; ok {
				t.Errorf("dead-lettered %s accepted by the sink", id)
			}
			continue
		}
		if _, ok := sink[id]; !ok {
			t.Errorf("usage id %s in the ledger, not at the sink", id)
		}
	}
	if len(sink) != len(ids)-countDead(q.Records) {
		t.Errorf("sink holds %d ids, ledger %d (%d dead)", len(sink), len(ids), countDead(q.Records))
	}
	var dl struct {
		DeadLetters []struct {
			Record metering.RecordDoc `json:"record"`
			Code   int                `json:"code"`
		} `json:"dead_letters"`
	}
	getJSON(t, base+"/v1/metering/dead-letters", &dl)
	if len(dl.DeadLetters) != countDead(q.Records) || len(dl.DeadLetters) == 0 || dl.DeadLetters[0].Code != 400 {
		t.Errorf("dead letters %+v, want %d with code 400", dl.DeadLetters, countDead(q.Records))
	}
	// 429 and 503 were retried: some ids were posted more than once.
	col.mu.Lock()
	retried := 0
	for _, n := range col.posts {
		if n > 1 {
			retried++
		}
	}
	col.mu.Unlock()
	if retried == 0 {
		t.Error("no record was retried: the 429/503 script did not run")
	}
	var st metering.Status
	getJSON(t, base+"/v1/metering/status", &st)
	if len(st.Groups) != 4 {
		t.Errorf("status %+v", st)
	}
}

func findRecord(recs []metering.RecordDoc, id string) metering.RecordDoc {
	for _, r := range recs {
		if r.UsageID == id {
			return r
		}
	}
	return metering.RecordDoc{}
}

func countDead(recs []metering.RecordDoc) int {
	n := 0
	for _, r := range recs {
		if r.ResourceInstanceID == "dead" {
			n++
		}
	}
	return n
}

// TestBill tracks series through the tracker API, lets the samplers record a
// per-minute active-series sample for some minutes, and checks the p95 bill.
func TestBill(t *testing.T) {
	c := startCluster(t, 1, "", true)
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).UnixMilli()
	c.setClock(t0)
	cc, err := grpc.NewClient(c.nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tr := api.NewTrackerClient(cc)
	base := "http://" + c.nodes[0].HTTPAddr()
	total := 0
	for minute := range 20 {
		// One more batch of series each minute, spread over partitions.
		for p := range 4 {
			part := p * 16
			first, _ := api.PartitionHashRange(part, 64)
			var hs []uint64
			for j := range 10 {
				hs = append(hs, first+uint64(minute*100+j))
			}
			if _, err := tr.TrackSeries(context.Background(), &api.TrackSeriesRequest{Tenant: "acme", Partition: uint32(part), Hashes: hs}); err != nil {
				t.Fatal(err)
			}
		}
		total += 40
		c.advance(time.Minute)
		waitSample(t, base, t0, int64(total))
	}
	var b metering.Bill
	getJSON(t, fmt.Sprintf("%s/v1/usage/bill?tenant=acme&from=%d&to=%d", base, t0+60_000, t0+30*60_000), &b)
	// Minutes 1..20 sampled with 40·k series; nearest-rank p95 of 20 values is the 19th.
	if b.Minutes != 20 || b.P95 != 19*40 || b.Max != int64(total) {
		t.Fatalf("bill %+v", b)
	}
	// /api/v1/status bills the month to date as /v1/usage/bill does for
	// the calendar month. (A sample at minute 0 may exist or not, depending
	// on when the sampler's first pass ran: the p95 is 19·40 either way.)
	monthFrom := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	monthTo := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var mb metering.Bill
	getJSON(t, fmt.Sprintf("%s/v1/usage/bill?tenant=acme&from=%d&to=%d", base, monthFrom, monthTo), &mb)
	var st struct {
		Billing *metering.BillingSummary `json:"billing"`
	}
	getJSON(t, base+"/api/v1/status", &st)
	bs := st.Billing
	if bs == nil || bs.Month != "2026-11" || bs.From != monthFrom || bs.To != monthTo || bs.NowMs != t0+20*60_000 ||
		bs.TenantsTotal != 1 || bs.Truncated || len(bs.Errors) != 0 || len(bs.Tenants) != 1 {
		t.Fatalf("status billing %+v", bs)
	}
	if bs.Tenants[0] != mb || mb.P95 != 19*40 || mb.Max != int64(total) {
		t.Fatalf("status billing row %+v, /v1/usage/bill for the month %+v", bs.Tenants[0], mb)
	}
	// Five quiet minutes: no new sample (the count did not change), so a
	// window after minute 20 is billed from the sample in force at its start.
	c.advance(5 * time.Minute)
	var qb metering.Bill
	getJSON(t, fmt.Sprintf("%s/v1/usage/bill?tenant=acme&from=%d&to=%d", base, t0+22*60_000, t0+25*60_000), &qb)
	if qb.Minutes != 3 || qb.P95 != int64(total) || qb.Max != int64(total) {
		t.Fatalf("bill of minutes 22..24 %+v, want 3 minutes at %d", qb, total)
	}
}

// TestBillingSummaryAcrossNodes: with one voter per group on two nodes (one
// zone, so placement does not add a voter per zone),
// each node holds only some groups' samples and reads the others from
// their leader (GroupSeriesSamples); every node's /api/v1/status shows the
// bill /v1/usage/bill computes.
func TestBillingSummaryAcrossNodes(t *testing.T) {
	c := startCluster(t, 2, "", true, func(cfg *server.Config) { cfg.Cluster.Replicas, cfg.Node.Zone = 1, "zone-a" })
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).UnixMilli()
	c.setClock(t0)
	for _, s := range c.nodes {
		if held := len(s.Metering().Status().Groups); held == 0 || held == 4 {
			t.Fatalf("%s holds %d of 4 groups: the test needs groups held elsewhere", s.NodeID(), held)
		}
	}
	// Series go to the node leading the partition's group.
	var trs []api.TrackerClient
	for _, s := range c.nodes {
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		trs = append(trs, api.NewTrackerClient(cc))
	}
	track := func(tenant string, part int, hs []uint64) {
		var errs []error
		for _, tr := range trs {
			_, err := tr.TrackSeries(context.Background(), &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(part), Hashes: hs})
			if err == nil {
				return
			}
			errs = append(errs, err)
		}
		t.Fatalf("track %s partition %d: %v", tenant, part, errs)
	}
	base := "http://" + c.nodes[0].HTTPAddr()
	total := 0
	for minute := range 3 {
		for p := range 4 { // partitions of every group
			part := p * 16
			first, _ := api.PartitionHashRange(part, 64)
			var hs []uint64
			for j := range 5 + p {
				hs = append(hs, first+uint64(minute*100+j))
			}
			track("acme", part, hs)
			track("beta", part, hs[:len(hs)-1])
			if p == 3 {
				track("gamma", part, hs[:1])
			}
		}
		total += 5 + 6 + 7 + 8
		c.advance(time.Minute)
		waitSample(t, base, t0, int64(total))
	}
	monthFrom := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	monthTo := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for _, s := range c.nodes {
		var st struct {
			Billing *metering.BillingSummary `json:"billing"`
		}
		getJSON(t, "http://"+s.HTTPAddr()+"/api/v1/status", &st)
		bs := st.Billing
		if bs == nil || bs.TenantsTotal != 3 || len(bs.Tenants) != 3 || len(bs.Errors) != 0 {
			t.Fatalf("%s: status billing %+v", s.NodeID(), bs)
		}
		for i, row := range bs.Tenants {
			var want metering.Bill
			getJSON(t, fmt.Sprintf("http://%s/v1/usage/bill?tenant=%s&from=%d&to=%d", s.HTTPAddr(), row.Tenant, monthFrom, monthTo), &want)
			if row != want {
				t.Errorf("%s: status billing row %d %+v, /v1/usage/bill %+v", s.NodeID(), i, row, want)
			}
		}
		// Highest p95 first, ties broken by max, then name.
		if bs.Tenants[0].Tenant != "acme" || bs.Tenants[1].Tenant != "beta" || bs.Tenants[2].Tenant != "gamma" ||
			bs.Tenants[0].Max != int64(total) || bs.Tenants[1].Max != int64(total-3*4) || bs.Tenants[2].Max != 3 {
			t.Errorf("%s: status billing rows %+v", s.NodeID(), bs.Tenants)
		}
	}
}

func waitSample(t *testing.T, base string, t0, total int64) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var b metering.Bill
		getJSON(t, fmt.Sprintf("%s/v1/usage/bill?tenant=acme&from=%d&to=%d", base, t0+60_000, t0+60*60_000), &b)
		if b.Max >= total {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no series sample of %d series", total)
}
