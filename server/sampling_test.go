package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/service/runtimecfg"
	samplingsvc "github.com/tollgate-io/tollgate/service/sampling"
)

// samplingCluster starts a 3-node cluster with HTTP listeners and returns it,
// a Config client on node 1, and a node that is NOT the config owner.
func samplingCluster(t *testing.T) (*testCluster, api.ConfigClient, *Server) {
	t.Helper()
	tc := startCluster(t, 3, func(_ int, c *Config) { c.HTTPAddr = "127.0.0.1:0" })
	owner := tc.leader(runtimecfg.OrderGroup)
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
	_, err := cfg.SetLimits(adminCtx(t), &api.SetLimitsRequest{Global: true, Set: kv})
	for deadline := time.Now().Add(30 * time.Second); status.Code(err) == codes.Unavailable && time.Now().Before(deadline); {
		// Group 0 between leaders (a loaded machine): retry, as the CLI does.
		time.Sleep(100 * time.Millisecond)
		_, err = cfg.SetLimits(adminCtx(t), &api.SetLimitsRequest{Global: true, Set: kv})
	}
	if err != nil {
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

// (b) The backlog controller, enabled through the config, runs on the config
// owner; backlog reports posted over HTTP to another node drive the global
// percentage down (in every node's replica of the config) and back up. (That
// a client's sampler follows the config: integration's
// TestSamplingRatesReachClientSampler.)
func TestBacklogControllerDrivesGlobalRate(t *testing.T) {
	tc, cfg, other := samplingCluster(t)
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
	for _, s := range tc.live() { // every node's replica has it
		waitFor(t, s.cfg.NodeID+"'s replica at 5%", func() bool { return s.RuntimeConfig().GlobalSampleRate("locate") == 5 })
	}
	resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	owner := tc.leader(runtimecfg.OrderGroup)
	// Writes is not checked: the replicas at 5% above show the write, and a
	// controller that took over after it (group 0's leadership moved under
	// load; a CI run saw steps 1, writes 0) has nothing left to write.
	if c := resp.Controller; c == nil || c.Owner != owner.cfg.NodeID || !c.Enabled || c.InputBacklog != 3000 || c.TargetBacklog != 1000 ||
		c.OutputPercent != 5 {
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

	// /api/v1/status on the non-owner names the owner.
	code, body := getHTTP(t, other, "/api/v1/status")
	var st NodeStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.SamplingController == nil ||
		st.SamplingController.Owner != owner.cfg.NodeID || st.SamplingController.IsOwner || st.SamplingController.Kind != "locate" {
		t.Fatalf("/api/v1/status on %s: %d %s", other.cfg.NodeID, code, body)
	}
}

// (c) Every controller the document accepts runs: a kind starting with a
// digit, which the document took and the controller once refused (its
// samplers' kind rule disagreed), is enabled, with its metric. Bad backlog
// reports answer 4xx (also when forwarded), and the token is required.
func TestBacklogControllerRejects(t *testing.T) {
	tc, cfg, other := samplingCluster(t)
	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "9locate", "backlog_controller.target": "1000",
		"backlog_controller.period": "1s", "backlog_controller.kp": "0.5"})
	var c *api.SamplingControllerStatus
	waitFor(t, "the controller of kind 9locate enabled", func() bool {
		resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		c = resp.Controller
		return c != nil && c.Kind == "9locate" && c.Owner != "" && c.Enabled
	})
	owner := tc.leader(runtimecfg.OrderGroup)
	waitFor(t, "enabled metric 1", func() bool {
		return gaugeValue(t, owner, "tollgate_sampling_controller_enabled", "kind", "9locate") == 1
	})

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
	p := samplingsvc.Params{MinPercent: 5, MaxPercent: 100}
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
