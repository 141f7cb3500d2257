package server

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/sampling"
	"github.com/tollgate-io/tollgate/configsvc"
	"github.com/tollgate-io/tollgate/samplectl"
)

// samplingCluster starts a 3-node cluster with HTTP listeners and returns it,
// a Config client on node 1, and a node that is NOT the config owner.
func samplingCluster(t *testing.T) (*testCluster, api.ConfigClient, *Server) {
	t.Helper()
	tc := startCluster(t, 3, func(_ int, c *Config) { c.HTTPAddr = "127.0.0.1:0" })
	owner := tc.leader(configsvc.OrderGroup)
	var other *Server
	for _, s := range tc.live() {
		if s != owner {
			other = s
			break
		}
	}
	return tc, api.NewConfigClient(dial(t, tc.nodes[0].GRPCAddr())), other
}

func setGlobal(t *testing.T, cfg api.ConfigClient, kv map[string]string) {
	t.Helper()
	if _, err := cfg.SetLimits(adminCtx(t), &api.SetLimitsRequest{Global: true, Set: kv}); err != nil {
		t.Fatalf("set global %v: %v", kv, err)
	}
}

func postBacklog(t *testing.T, s *Server, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr()+"/api/v1/backlog", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST %s: %d, body is not JSON: %q", body, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

func newFedSampler(t *testing.T, addr string) (*clientlib.Client, *sampling.Sampler) {
	t.Helper()
	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	smp := sampling.New(sampling.Options{})
	stop := c.FeedSampler(smp, func(v uint64, err error) { t.Errorf("sampler refused version %d: %v", v, err) })
	t.Cleanup(stop)
	return c, smp
}

// (a) A global and a tenant percentage set through the Config service reach
// a client's sampler on its cluster stream: 50% × 40% = 20%.
func TestSamplingRatesReachClientSampler(t *testing.T) {
	tc, cfg, _ := samplingCluster(t)
	_, smp := newFedSampler(t, tc.nodes[2].GRPCAddr())
	setGlobal(t, cfg, map[string]string{"sample_rates.locate": "50"})
	if _, err := cfg.SetLimits(adminCtx(t), &api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"sample_rates.locate": "40"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "acme's locate rate 20% in the client's sampler", func() bool {
		return math.Abs(smp.Rate("acme", "locate")-20) < 1e-9
	})
	if r := smp.Rate("other", "locate"); r != 50 {
		t.Fatalf("another tenant's locate rate %v, want the global 50", r)
	}
	if r := smp.Rate("acme", "submit"); r != 100 {
		t.Fatalf("an unconfigured kind: %v, want 100", r)
	}
	// Deterministic item decisions follow the same rate: over 20,000 item
	// hashes about 20% are kept.
	kept := 0
	for i := range uint64(20000) {
		if smp.ShouldSampleItem("acme", "locate", i) {
			kept++
		}
	}
	if kept < 3600 || kept > 4400 {
		t.Fatalf("%d of 20000 items kept at 20%%", kept)
	}
}

// (b) The backlog controller, enabled through the config, runs on the config
// owner; backlog reports posted over HTTP to another node drive the global
// percentage down (in the replicated config and in a client) and back up.
func TestBacklogControllerDrivesGlobalRate(t *testing.T) {
	tc, cfg, other := samplingCluster(t)
	_, smp := newFedSampler(t, tc.nodes[0].GRPCAddr())
	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "locate", "backlog_controller.target": "1000",
		"backlog_controller.period": "1s", "backlog_controller.kp": "0.5", "backlog_controller.min_percent": "5"})

	// 3,000 queued = 3× target: e = −2, kp term −100 → the floor, 5%.
	code, out := postBacklog(t, other, testToken, `{"kind":"locate","backlog":3000,"source":"q1"}`)
	if code != http.StatusOK || out["enabled"] != true || out["kind"] != "locate" {
		t.Fatalf("report to non-owner %s: %d %v", other.cfg.NodeID, code, out)
	}
	globalRate := func() float64 {
		resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := resp.Config.GetGlobal().GetSampleRates()["locate"]; ok {
			return p
		}
		return 100
	}
	waitFor(t, "global locate rate driven to 5%", func() bool {
		// Keep the report fresh (stale after 3 periods) while waiting.
		postBacklog(t, other, testToken, `{"kind":"locate","backlog":3000,"source":"q1"}`)
		return globalRate() == 5
	})
	waitFor(t, "the client's sampler at 5%", func() bool { return smp.Rate("anyone", "locate") == 5 })
	for _, s := range tc.live() { // every node's replica has it
		waitFor(t, s.cfg.NodeID+"'s replica at 5%", func() bool { return s.RuntimeConfig().GlobalSampleRate("locate") == 5 })
	}
	resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	owner := tc.leader(configsvc.OrderGroup)
	if c := resp.Controller; c == nil || c.Owner != owner.cfg.NodeID || !c.Enabled || c.InputBacklog != 3000 || c.TargetBacklog != 1000 ||
		c.OutputPercent != 5 || c.Writes == 0 {
		t.Fatalf("controller state in GetLimits: %+v (owner %s)", resp.Controller, owner.cfg.NodeID)
	}
	// The Admin Status RPC, asked on a node that does not run the controller,
	// carries the owner's live state (reports and steps only the owner counts).
	if c := adminStatus(t, other).SamplingController; c == nil || c.Owner != owner.cfg.NodeID || !c.Enabled || c.Kind != "locate" || c.Reports == 0 || c.Steps == 0 {
		t.Fatalf("controller state in Status on %s: %+v (owner %s)", other.cfg.NodeID, c, owner.cfg.NodeID)
	}
	if v := gaugeValue(t, owner, "tollgate_sampling_controller_output_percent", "kind", "locate"); v != 5 {
		t.Fatalf("owner's output metric %v, want 5", v)
	}
	if v := gaugeValue(t, owner, "tollgate_sampling_controller_input_backlog", "kind", "locate"); v != 3000 {
		t.Fatalf("owner's input metric %v, want 3000", v)
	}

	// The backlog drains: e = 1, the output goes back to 100%.
	waitFor(t, "global locate rate back to 100%", func() bool {
		postBacklog(t, other, testToken, `{"kind":"locate","backlog":0,"source":"q1"}`)
		return globalRate() == 100
	})
	waitFor(t, "the client's sampler back at 100%", func() bool { return smp.Rate("anyone", "locate") == 100 })

	// /api/v1/status on the non-owner names the owner.
	code, body := getHTTP(t, other, "/api/v1/status")
	var st NodeStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.SamplingController == nil ||
		st.SamplingController.Owner != owner.cfg.NodeID || st.SamplingController.IsOwner || st.SamplingController.Kind != "locate" {
		t.Fatalf("/api/v1/status on %s: %d %s", other.cfg.NodeID, code, body)
	}
}

// (c) Parameters the document accepts but the controller refuses disable it,
// with the reason in GetLimits, /api/v1/status and the metrics; bad backlog
// reports answer 4xx (also when forwarded), and the token is required.
func TestBacklogControllerRejects(t *testing.T) {
	tc, cfg, other := samplingCluster(t)
	// A kind starting with a digit: valid in the document, refused by the
	// controller (the client samplers' kind rules).
	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "9locate", "backlog_controller.target": "1000",
		"backlog_controller.period": "1s", "backlog_controller.kp": "0.5"})
	var c *api.SamplingControllerStatus
	waitFor(t, "the controller disabled with a reason", func() bool {
		resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		c = resp.Controller
		return c != nil && c.Kind == "9locate" && c.Owner != ""
	})
	if c.Enabled || !strings.Contains(c.Reason, "must start with a letter") {
		t.Fatalf("controller %+v, want disabled naming the kind rule", c)
	}
	owner := tc.leader(configsvc.OrderGroup)
	waitFor(t, "enabled metric 0", func() bool {
		return gaugeValue(t, owner, "tollgate_sampling_controller_enabled", "kind", "9locate") == 0
	})
	code, body := getHTTP(t, owner, "/api/v1/status")
	var st NodeStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.SamplingController == nil ||
		st.SamplingController.Enabled || !strings.Contains(st.SamplingController.Reason, "must start with a letter") {
		t.Fatalf("/api/v1/status on the owner: %d %s", code, body)
	}
	// A disabled controller never writes.
	if p := owner.RuntimeConfig().GlobalSampleRate("9locate"); p != 100 {
		t.Fatalf("disabled controller wrote %v", p)
	}

	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "locate"})
	waitFor(t, "the controller enabled on the owner", func() bool {
		st := owner.sampling.State()
		return st.Enabled && st.Kind == "locate"
	})
	for _, s := range []*Server{owner, other} {
		for _, bad := range []struct {
			token, body string
			code        int
			msg         string
		}{
			{testToken, `{"kind":"locate","backlog":-5}`, 400, "finite number ≥ 0"},
			{testToken, `{"kind":"locate"}`, 400, `"backlog" is required`},
			{testToken, `{"kind":"locate","backlog":"many"}`, 400, "field backlog: expected a number"},
			{testToken, `{"kind":"submit","backlog":5}`, 422, `"submit"`},
			{testToken, `{"kind":"locate","backlog":5,"source":"` + strings.Repeat("s", 200) + `"}`, 400, "source"},
			{"wrong", `{"kind":"locate","backlog":5}`, 401, "admin token"},
			{"", `{"kind":"locate","backlog":5}`, 401, "admin token"},
		} {
			code, out := postBacklog(t, s, bad.token, bad.body)
			msg, _ := out["error"].(string)
			if code != bad.code || !strings.Contains(msg, bad.msg) {
				t.Errorf("%s: POST %.60s: %d %q, want %d naming %q", s.cfg.NodeID, bad.body, code, msg, bad.code, bad.msg)
			}
		}
	}
	// The owner counted the reports its controller rejected (negative backlog,
	// unknown kind, long source), its own and the forwarded ones; the rest
	// never got past the handler or the token check.
	if st := owner.sampling.State(); st.Rejected != 6 || st.Reports != 0 {
		t.Fatalf("owner's counters: %d rejected, %d accepted", st.Rejected, st.Reports)
	}
}

func getHTTP(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := testHTTP.Get(fmt.Sprintf("http://%s%s", s.HTTPAddr(), path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// worthWriting: moves under 0.5 points are not worth G raft entries, except
// one that reaches a bound exactly (so the rate can return to 100%).
func TestSamplingWorthWriting(t *testing.T) {
	p := samplectl.Params{MinPercent: 5, MaxPercent: 100}
	for _, c := range []struct {
		want, cur float64
		write     bool
	}{
		{50, 50, false}, {50.4, 50, false}, {50.5, 50, true}, {49.5, 50, true},
		{100, 99.8, true}, {5, 5.2, true}, {99.9, 100, false}, {5.3, 5, false},
	} {
		if got := worthWriting(c.want, c.cur, p); got != c.write {
			t.Errorf("worthWriting(%v, %v) = %v, want %v", c.want, c.cur, got, c.write)
		}
	}
}
