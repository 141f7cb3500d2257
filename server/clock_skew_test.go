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
	tc := startCluster(t, 3, func(i int, c *Config) { c.Node.HTTPAddr = "127.0.0.1:0"; c.Clock.TestOffset = skew[i] })
	want := map[string]time.Duration{"n1": skew[0] - skew[1], "n2": 0, "n3": skew[2] - skew[1]}
	type member struct {
		ID         string `json:"id"`
		OffsetNs   *int64 `json:"clock_offset_ns"`
		OutOfBound bool   `json:"clock_out_of_bound"`
	}
	// A sample is off by up to half its round trip, and a loaded machine
	// can stretch one round trip far beyond the 50 ms checked below: the
	// offsets are sampled again every probe period, so the page is read
	// again until every offset is within the bound (a wrong computation
	// never gets there and times out, with the last page in the failure).
	within := func(got, want time.Duration) bool {
		d := got - want
		return d <= 50*time.Millisecond && d >= -50*time.Millisecond
	}
	var last string
	waitFor(t, "n1's overview to show every member's clock offset, each within 50 ms of the injected one", func() bool {
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
				if m.OffsetNs == nil || !within(time.Duration(*m.OffsetNs), want[m.ID]) {
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
			if !within(got, want[m.ID]) {
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
		return within(time.Duration(st.Clock.MedianNs), want["n3"]) // sampled again while a slow round trip skews it
	})
	if st.Clock.InBound || !strings.Contains(st.Clock.Reason, "clock out of bound") || st.Clock.MaxOffsetNs != int64(time.Second) {
		t.Errorf("n3 status clock: %+v, want out of bound with the reason and the 1s bound", st.Clock)
	}
	if !within(time.Duration(st.Clock.MedianNs), want["n3"]) {
		t.Errorf("n3 status: median offset %v, injected %v", time.Duration(st.Clock.MedianNs), want["n3"])
	}
	if code, body := get(t, tc.nodes[2], "/readyz"); code != http.StatusOK || !strings.Contains(body, "follower only") || !strings.Contains(body, "clock out of bound") {
		t.Errorf("n3 /readyz: %d %q, want 200 ready (follower only): clock out of bound", code, body)
	}
}
