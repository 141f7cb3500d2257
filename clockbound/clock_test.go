package clockbound

import (
	"strings"
	"testing"
	"time"
)

// TestMedianOf: the reference clock is the median of every measured clock;
// with an even count the middle value nearer this node's own (0), so a tie
// never puts a node out of bound.
func TestMedianOf(t *testing.T) {
	m := time.Minute
	for _, tc := range []struct {
		offs []time.Duration
		want time.Duration
	}{
		{[]time.Duration{0}, 0},
		{[]time.Duration{0, 5 * m, 10 * m}, 5 * m},    // this node +5m, peers correct and −5m
		{[]time.Duration{0, -5 * m, 5 * m}, 0},        // this node correct, peers ±5m
		{[]time.Duration{0, -5 * m, -10 * m}, -5 * m}, // this node −5m
		{[]time.Duration{0, 5 * m}, 0},                // a tie: this node's own clock
		{[]time.Duration{0, -3 * m}, 0},
		{[]time.Duration{0, 2 * m, 3 * m, 4 * m}, 2 * m}, // even: nearer 0 of the middle two
	} {
		if got := medianOf(append([]time.Duration(nil), tc.offs...)); got != tc.want {
			t.Errorf("medianOf(%v) = %v, want %v", tc.offs, got, tc.want)
		}
	}
}

// TestMajorityRule drives recomputeLocked with samples held (no probe, no
// node): a node is confirmed only when a majority of the voters' clocks,
// its own included, are fresh and within the bound of its own.
func TestMajorityRule(t *testing.T) {
	now := time.Now()
	peer := func(id string, off time.Duration, at time.Time) *peerClock {
		return &peerClock{id: id, samples: []sample{{offset: off, rtt: time.Millisecond, at: at}}, lastAt: at}
	}
	voters3 := map[string]bool{"n1": true, "n2": true, "n3": true}
	for _, tc := range []struct {
		name      string
		peers     []*peerClock
		voters    int
		ids       map[string]bool
		confirmed bool
		prefix    string
	}{
		{"alone of three", nil, 3, voters3, false, "clock not confirmed: 1 of the 3"},
		{"one peer agrees", []*peerClock{peer("n2", 100*time.Millisecond, now)}, 3, voters3, true, ""},
		// Two live clocks of three that disagree: the median is this
		// node's own, but no majority agrees, so neither leads.
		{"two disagree", []*peerClock{peer("n2", 5*time.Minute, now)}, 3, voters3, false, "clock not confirmed: only 1 of the 3"},
		{"stale peer does not count", []*peerClock{peer("n2", 0, now.Add(-2*freshAge))}, 3, voters3, false, "clock not confirmed: 1 of the 3"},
		{"non-voter does not count", []*peerClock{peer("n9", 0, now)}, 3, voters3, false, "clock not confirmed: 1 of the 3"},
		{"median far", []*peerClock{peer("n2", 5*time.Minute, now), peer("n3", 5*time.Minute, now)}, 3, voters3, false, "clock out of bound"},
		{"no configuration: every peer counts", []*peerClock{peer("n9", 0, now)}, 2, map[string]bool{}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Clock{cfg: Config{NodeID: "n1"}, bound: time.Second, peers: map[string]*peerClock{}}
			for _, p := range tc.peers {
				c.peers[p.id] = p
			}
			c.recomputeLocked(tc.voters, tc.ids)
			if c.inBound != tc.confirmed || c.ok.Load() != tc.confirmed {
				t.Fatalf("confirmed = %v (ok %v), want %v; reason %q", c.inBound, c.ok.Load(), tc.confirmed, c.reason)
			}
			if !strings.HasPrefix(c.reason, tc.prefix) || (tc.prefix == "") != (c.reason == "") {
				t.Fatalf("reason %q, want prefix %q", c.reason, tc.prefix)
			}
		})
	}
}
