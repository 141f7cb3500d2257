package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestClockOffsetsShown: what the dashboard (/api/v1/overview) and
// /api/v1/status show of three nodes whose wall clocks are shifted by 0,
// +300 ms and +5 min. The median clock is n2's, so each member's offset from
// it is −300 ms, 0 and +4m59.7s, each within 50 ms (a sample is off by at most
// half its round trip); only n3 is marked out of bound, and its own status
// and /readyz say why.
func TestClockOffsetsShown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	skew := []time.Duration{0, 300 * time.Millisecond, 5 * time.Minute}
	tc := startCluster(t, 3, func(i int, c *Config) { c.HTTPAddr = "127.0.0.1:0"; c.TestClockOffset = skew[i] })
	want := map[string]time.Duration{"n1": skew[0] - skew[1], "n2": 0, "n3": skew[2] - skew[1]}
	type member struct {
		ID         string `json:"id"`
		OffsetNs   *int64 `json:"clock_offset_ns"`
		OutOfBound bool   `json:"clock_out_of_bound"`
	}
	var last string
	waitFor(t, "n1's overview to show every member's clock offset", func() bool {
		code, body := get(t, tc.nodes[0], "/api/v1/overview", "Authorization", "Bearer "+testToken)
		last = body
		var ov struct {
			Zones []struct {
				Members []member `json:"members"`
			} `json:"zones"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &ov) != nil {
			return false
		}
		seen := 0
		for _, z := range ov.Zones {
			for _, m := range z.Members {
				if m.OffsetNs == nil {
					return false
				}
				seen++
			}
		}
		return seen == 3
	})
	var ov struct {
		Zones []struct {
			Members []member `json:"members"`
		} `json:"zones"`
	}
	if err := json.Unmarshal([]byte(last), &ov); err != nil {
		t.Fatal(err)
	}
	for _, z := range ov.Zones {
		for _, m := range z.Members {
			got := time.Duration(*m.OffsetNs)
			t.Logf("%s: offset from the median %v, want %v; out of bound %v", m.ID, got, want[m.ID], m.OutOfBound)
			if d := got - want[m.ID]; d > 50*time.Millisecond || d < -50*time.Millisecond {
				t.Errorf("%s: overview shows offset %v, injected %v: off by more than 50 ms", m.ID, got, want[m.ID])
			}
			if m.OutOfBound != (m.ID == "n3") {
				t.Errorf("%s: overview marks out of bound: %v, want %v", m.ID, m.OutOfBound, m.ID == "n3")
			}
		}
	}
	var st NodeStatus
	waitFor(t, "n3 to have measured both peers", func() bool {
		code, body := get(t, tc.nodes[2], "/api/v1/status", "Authorization", "Bearer "+testToken)
		st = NodeStatus{}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.Clock == nil || len(st.Clock.Peers) != 2 {
			return false
		}
		for _, p := range st.Clock.Peers {
			if p.Error != "" || p.RTTNs == 0 {
				return false
			}
		}
		return true
	})
	if st.Clock.InBound || !strings.Contains(st.Clock.Reason, "clock out of bound") || st.Clock.MaxOffsetNs != int64(time.Second) {
		t.Errorf("n3 status clock: %+v, want out of bound with the reason and the 1s bound", st.Clock)
	}
	if d := time.Duration(st.Clock.MedianNs) - want["n3"]; d > 50*time.Millisecond || d < -50*time.Millisecond {
		t.Errorf("n3 status: median offset %v, injected %v", time.Duration(st.Clock.MedianNs), want["n3"])
	}
	if code, body := get(t, tc.nodes[2], "/readyz"); code != http.StatusOK || !strings.Contains(body, "follower only") || !strings.Contains(body, "clock out of bound") {
		t.Errorf("n3 /readyz: %d %q, want 200 ready (follower only): clock out of bound", code, body)
	}
}
