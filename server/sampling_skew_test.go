package server

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/service/runtimecfg"
)

// TestBacklogControllerSkewedClocks: the backlog controller with wrong node
// clocks. n1 and n2 are within the bound of each other (+450 ms and −450 ms,
// 900 ms apart, the bound is 1 s); n3 is 5 min fast, beyond it. The controller
// reads one clock only, its owner's, and through a time.Time that carries the
// monotonic reading: reports are stamped when they reach the owner (a
// forwarded report carries no time), staleness and the step period are
// differences on that clock, and a new owner starts afresh. So:
//   - beyond the bound: n3 never runs the controller (it does not lead group
//     0) and the reports it forwards drive the output as any other's;
//   - within the bound: the controller moves between n1 and n2 and the
//     output follows the backlog on each, as with correct clocks.
//
// Reports stamped 5 min off the owner's clock (tried by shifting the stamp)
// are stale on arrival: the controller holds its output at 100% and the
// first wait fails.
func TestBacklogControllerSkewedClocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	skew := []time.Duration{450 * time.Millisecond, -450 * time.Millisecond, 5 * time.Minute}
	tc := startCluster(t, 3, func(i int, c *Config) { c.Node.HTTPAddr = "127.0.0.1:0"; c.Clock.TestOffset = skew[i] })
	fast := tc.nodes[2]
	waitFor(t, "n3 out of bound and not leading group 0", func() bool {
		st := fast.clock.Status()
		return st != nil && !st.InBound && fast.Raft(runtimecfg.OrderGroup).State() != raft.Leader
	})
	cfg := api.NewConfigClient(dial(t, tc.nodes[0].GRPCAddr()))
	setGlobal(t, cfg, map[string]string{"backlog_controller.kind": "locate", "backlog_controller.target": "1000",
		"backlog_controller.period": "1s", "backlog_controller.kp": "0.5", "backlog_controller.min_percent": "5"})
	// -1 while group 0 answers no GetLimits (between leaders): the waits retry.
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
	// report posts through the node 5 min fast, which forwards to the owner;
	// false on 503 (no leader reachable while group 0 changes hands: a
	// reporter retries).
	report := func(backlog string) bool {
		code, out := postBacklog(t, fast, testToken, `{"kind":"locate","backlog":`+backlog+`,"source":"q1"}`)
		if code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Fatalf("report through %s: %d %v", fast.cfg.Node.ID, code, out)
		}
		return code == http.StatusOK
	}
	// 3,000 queued = 3× target: the proportional term takes the output to the floor.
	waitFor(t, "global locate rate driven to 5% from reports through the fast node", func() bool {
		return report("3000") && globalRate() == 5
	})
	first := tc.leader(runtimecfg.OrderGroup)
	if first == fast {
		t.Fatalf("the node 5 min fast runs the controller")
	}
	// The controller moves to the other in-bound node, whose clock is 900 ms
	// from the first owner's. Drained backlog: back to 100% on the new owner.
	var second *Server
	for _, s := range tc.nodes[:2] {
		if s != first {
			second = s
		}
	}
	adm := api.NewAdminClient(dial(t, first.GRPCAddr()))
	waitFor(t, "group 0 led by "+second.cfg.Node.ID, func() bool {
		if second.Raft(runtimecfg.OrderGroup).State() == raft.Leader {
			return true
		}
		_, _ = adm.TransferLeadership(adminCtx(t), &api.TransferLeadershipRequest{Group: runtimecfg.OrderGroup, ToId: second.cfg.Node.ID})
		time.Sleep(300 * time.Millisecond) // a transfer in flight: let it land
		return false
	})
	waitFor(t, "global locate rate back to 100% under the new owner", func() bool {
		return report("0") && globalRate() == 100
	})
	// And down again: the new owner's controller acts on the fast node's
	// reports, stamped on arrival by the owner's clock.
	waitFor(t, "global locate rate driven to 5% again", func() bool {
		return report("3000") && globalRate() == 5
	})
	// The controller's state on the new owner. On a loaded machine group 0's
	// leadership can move back to the first owner (a missed heartbeat, the
	// leader balancer) between that wait and this look: it is handed to the
	// second again and the state looked at anew, with fresh reports.
	eventually(t, "the controller running on "+second.cfg.Node.ID+" at 5%", func() error {
		if second.Raft(runtimecfg.OrderGroup).State() != raft.Leader {
			_, _ = adm.TransferLeadership(adminCtx(t), &api.TransferLeadershipRequest{Group: runtimecfg.OrderGroup, ToId: second.cfg.Node.ID})
			return fmt.Errorf("group 0 is not led by %s (leadership moved); handed back", second.cfg.Node.ID)
		}
		report("3000")
		if st := second.sampling.State(); !st.IsOwner || !st.Enabled || st.Reports == 0 || st.Steps == 0 || st.OutputPercent != 5 {
			return fmt.Errorf("controller on the new owner %s: %+v", second.cfg.Node.ID, st)
		}
		if r := globalRate(); r != 5 {
			return fmt.Errorf("global locate rate %v, want 5", r)
		}
		return nil
	})
	if st := fast.sampling.State(); st.IsOwner {
		t.Fatalf("the node 5 min fast claims the controller: %+v", st)
	}
}
