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
)

// samplingCluster starts a 3-node cluster with HTTP listeners and returns it,
// a Config client on node 1, and a node that is NOT the config owner.
func samplingCluster(t *testing.T) (*testCluster, api.ConfigClient, *Server) {
	t.Helper()
	tc := startCluster(t, 3, func(_ int, c *Config) { c.Node.HTTPAddr = "127.0.0.1:0" })
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
		t.Fatalf("report to non-owner %s: %d %v", other.cfg.Node.ID, code, out)
	}
	// globalRate is -1 while group 0 answers no GetLimits (between leaders on
	// a loaded machine): the waits below retry.
	globalRate := func() float64 {
		resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
		if err != nil {
			return -1
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
		waitFor(t, s.cfg.Node.ID+"'s replica at 5%", func() bool { return s.RuntimeConfig().GlobalSampleRate("locate") == 5 })
	}
	// The controller's state, as GetLimits, a non-owner's Status RPC and the
	// owner's metrics show it. Group 0's leadership (and with it the
	// controller) may move while this runs — the leader balancer moves groups
	// after start, and a loaded machine misses heartbeats — and a report goes
	// stale after 3 periods of a descheduled test: so the whole observation is
	// taken again, with a fresh report, until it is consistent, and the last
	// inconsistency is what a timeout reports. Writes is not checked: the
	// replicas at 5% above show the write, and a controller that took over
	// after it (a CI run saw steps 1, writes 0) has nothing left to write.
	eventually(t, "the controller's state at 5% on the owner, in GetLimits, Status and metrics", func() error {
		postBacklog(t, other, testToken, `{"kind":"locate","backlog":3000,"source":"q1"}`)
		resp, err := cfg.GetLimits(adminCtx(t), &api.GetLimitsRequest{})
		if err != nil {
			return fmt.Errorf("GetLimits: %w", err)
		}
		owner := tc.leader(runtimecfg.OrderGroup)
		if c := resp.Controller; c == nil || c.Owner != owner.cfg.Node.ID || !c.Enabled || c.InputBacklog != 3000 || c.TargetBacklog != 1000 ||
			c.OutputPercent != 5 {
			return fmt.Errorf("controller state in GetLimits: %+v (owner %s)", resp.Controller, owner.cfg.Node.ID)
		}
		// The Admin Status RPC, asked on a node that does not run the
		// controller, carries the owner's live state (reports and steps
		// only the owner counts).
		nonOwner := other
		if nonOwner == owner {
			nonOwner = otherThan(tc, owner)
		}
		st, err := api.NewAdminClient(dial(t, nonOwner.GRPCAddr())).Status(adminCtx(t), &api.StatusRequest{})
		if err != nil {
			return fmt.Errorf("status on %s: %w", nonOwner.cfg.Node.ID, err)
		}
		if c := st.SamplingController; c == nil || c.Owner != owner.cfg.Node.ID || !c.Enabled || c.Kind != "locate" || c.Reports == 0 || c.Steps == 0 {
			return fmt.Errorf("controller state in Status on %s: %+v (owner %s)", nonOwner.cfg.Node.ID, c, owner.cfg.Node.ID)
		}
		if v := gaugeValue(t, owner, "tollgate_sampling_controller_output_percent", "kind", "locate"); v != 5 {
			return fmt.Errorf("owner %s's output metric %v, want 5", owner.cfg.Node.ID, v)
		}
		if v := gaugeValue(t, owner, "tollgate_sampling_controller_input_backlog", "kind", "locate"); v != 3000 {
			return fmt.Errorf("owner %s's input metric %v, want 3000", owner.cfg.Node.ID, v)
		}
		return nil
	})

	// The backlog drains: e = 1, the output goes back to 100%.
	waitFor(t, "global locate rate back to 100%", func() bool {
		postBacklog(t, other, testToken, `{"kind":"locate","backlog":0,"source":"q1"}`)
		return globalRate() == 100
	})

	// /api/v1/status on a non-owner names the owner (taken again while the
	// owner moves, as above).
	eventually(t, "/api/v1/status on a non-owner names the owner", func() error {
		owner := tc.leader(runtimecfg.OrderGroup)
		nonOwner := other
		if nonOwner == owner {
			nonOwner = otherThan(tc, owner)
		}
		code, body := getHTTP(t, nonOwner, "/api/v1/status")
		var st NodeStatus
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.SamplingController == nil ||
			st.SamplingController.Owner != owner.cfg.Node.ID || st.SamplingController.IsOwner || st.SamplingController.Kind != "locate" {
			return fmt.Errorf("/api/v1/status on %s: %d %s (owner %s)", nonOwner.cfg.Node.ID, code, body, owner.cfg.Node.ID)
		}
		return nil
	})
}

// otherThan returns a live node of tc that is not s.
func otherThan(tc *testCluster, s *Server) *Server {
	for _, n := range tc.live() {
		if n != s {
			return n
		}
	}
	tc.t.Fatal("no live node besides " + s.cfg.Node.ID)
	return nil
}

// eventually retries an observation made of several reads until it holds;
// for state that a loaded machine may show mid-change (a leadership moving,
// a report going stale). It catches hangs only: the limit is generous, and a
// timeout reports the last way the observation failed.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: last: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
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
	var owner *Server
	waitFor(t, "enabled metric 1 on group 0's leader", func() bool { // the leader of the moment: leadership may move under load
		return gaugeValue(t, tc.leader(runtimecfg.OrderGroup), "tollgate_sampling_controller_enabled", "kind", "9locate") == 1
	})

	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "locate"})
	// The bad reports go to the owner and to another node (which forwards
	// them). The owner counts the ones its controller rejected; if group 0's
	// leadership moves meanwhile (a loaded machine), the counts split between
	// owners and forwarded reports may meet a leaderless moment (503): the
	// round is then run again on the new owner, its counters compared with
	// what they were before the round.
	for attempt := 1; ; attempt++ {
		owner = tc.leader(runtimecfg.OrderGroup)
		waitFor(t, "the controller enabled on the owner", func() bool {
			st := owner.sampling.State()
			return st.Enabled && st.Kind == "locate"
		})
		other = otherThan(tc, owner)
		before := owner.sampling.State()
		var wrong []string
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
					wrong = append(wrong, fmt.Sprintf("%s: POST %.60s: %d %q, want %d naming %q", s.cfg.Node.ID, bad.body, code, msg, bad.code, bad.msg))
				}
			}
		}
		after := owner.sampling.State()
		if now := tc.leader(runtimecfg.OrderGroup); (now != owner || !after.IsOwner) && attempt < 5 {
			t.Logf("round %d: group 0 moved from %s to %s during the round; again", attempt, owner.cfg.Node.ID, now.cfg.Node.ID)
			continue
		}
		for _, w := range wrong {
			t.Error(w)
		}
		// The owner counted the reports its controller rejected (negative
		// backlog, unknown kind, long source), its own and the forwarded
		// ones; the rest never got past the handler or the token check.
		if rej, acc := after.Rejected-before.Rejected, after.Reports-before.Reports; rej != 6 || acc != 0 {
			t.Fatalf("owner %s's counters over the round: %d rejected, %d accepted; want 6 and 0", owner.cfg.Node.ID, rej, acc)
		}
		return
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
