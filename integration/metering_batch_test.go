package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	climeter "github.com/tollgate-io/tollgate/clientlib/metering"
	"github.com/tollgate-io/tollgate/service/metering"
)

// TestBatchOverHTTP sends one batch per node of a real three-node cluster
// (events of every group: some local, the rest forwarded in one call per
// group) and checks each event's own status.
func TestBatchOverHTTP(t *testing.T) {
	c := startCluster(t, 3, "", true)
	now := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC).UnixMilli()
	c.setClock(now)
	item := func(kind, id string, ts int64, inst string, measures bool) string {
		return strings.Replace(doc(id, ts, inst, measures), "{", `{"kind":"`+kind+`",`, 1)
	}
	for n, s := range c.nodes {
		var items, want []string
		for i := range 40 { // 40 targets over 4 groups
			inst := fmt.Sprintf("b%d-%d", n, i)
			items = append(items, item("start", "s"+inst, now, inst, true), item("stop", "e"+inst, now+1000, inst, false),
				item("start", "s"+inst, now, inst, true))
			want = append(want, "201 created", "201 created", "201 duplicate")
		}
		items = append(items,
			item("stop", "e-none", now, fmt.Sprint("none-", n), false),
			item("start", "x", now, "i", false),
			item("pause", "x", now, "i", true),
			item("start", "old", now-63*24*3600*1000, fmt.Sprint("old-", n), true),
			`{"kind":"start","colour":"red"}`,
		)
		want = append(want, "422", "400 measured_usage", "400 kind", "422 slack", "400 colour")
		code, body := postRetry(t, "http://"+s.HTTPAddr()+"/v1/events", "application/json", `{"events":[`+strings.Join(items, ",")+`]}`)
		if code != 200 {
			t.Fatalf("batch via %s: %d %s", s.NodeID(), code, body)
		}
		var resp struct {
			Results []metering.BatchResultDoc `json:"results"`
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Results) != len(items) {
			t.Fatalf("batch via %s: %v, %d results for %d events", s.NodeID(), err, len(resp.Results), len(items))
		}
		for i, r := range resp.Results {
			w := strings.Fields(want[i])
			got := fmt.Sprint(r.Status, " ", r.Result, " ", r.Error)
			if fmt.Sprint(r.Status) != w[0] || (len(w) > 1 && !strings.Contains(got, w[1])) {
				t.Errorf("batch via %s, event %d: %s, want %s", s.NodeID(), i, got, want[i])
			}
		}
	}
	for _, bad := range []struct{ ctype, body string }{{"text/plain", `{"events":[]}`}, {"application/json", `[1,2]`}} {
		if code, body := post(t, "http://"+c.nodes[0].HTTPAddr()+"/v1/events", bad.ctype, bad.body); code != 415 && code != 400 {
			t.Errorf("bad batch %q: %d %s", bad.body, code, body)
		}
	}
	// The Go client's batch call: the same rules, per event.
	cc, err := grpc.NewClient(c.nodes[1].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := climeter.New(cc)
	tg := climeter.Target{OrganizationID: "o", SpaceID: "s", ConsumerID: "c", ResourceID: "r", PlanID: "p", ResourceInstanceID: "g1"}
	at := time.UnixMilli(now)
	res, err := cl.Events(context.Background(), []climeter.BatchEvent{
		{Event: climeter.Event{ID: "a", Timestamp: at, Target: tg, Measures: map[string]float64{"m": 1}}},
		{Event: climeter.Event{ID: "b", Timestamp: at, Target: tg, Measures: map[string]float64{"m": 1}}},
		{Stop: true, Event: climeter.Event{ID: "c", Timestamp: at.Add(-time.Hour), Target: tg}},
		{Event: climeter.Event{Timestamp: at, Target: climeter.Target{OrganizationID: "o"}}},
		{Stop: true, Event: climeter.Event{ID: "d", Timestamp: at.Add(time.Minute), Target: tg}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[0].SpanID == 0 || !errorsIs(res[1].Err, climeter.ErrConflict) ||
		!errorsIs(res[2].Err, climeter.ErrUnprocessable) || !errorsIs(res[3].Err, climeter.ErrInvalid) || res[4].Err != nil {
		t.Fatalf("client batch results: %+v", res)
	}
}
