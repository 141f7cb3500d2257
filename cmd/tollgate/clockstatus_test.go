package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// TestPrintClock: one node's Offsets answer becomes each node's offset from
// the median clock, and a node beyond the bound is named.
func TestPrintClock(t *testing.T) {
	// Measured by node-1 (correct): node-2 is 5 minutes fast, node-3 300 ms
	// slow. Offsets are node-1 minus the peer.
	o := &api.ClockOffsetsResponse{NodeId: "node-1", MaxOffsetNanos: int64(time.Second), MedianOffsetNanos: 0, InBound: true,
		Peers: []*api.PeerOffset{
			{NodeId: "node-3", OffsetNanos: int64(300 * time.Millisecond), RttNanos: int64(time.Millisecond), AgeNanos: int64(time.Second)},
			{NodeId: "node-2", OffsetNanos: -int64(5 * time.Minute), RttNanos: int64(time.Millisecond), AgeNanos: int64(time.Second)},
			{NodeId: "node-4", Error: "connection refused"},
		}}
	rows := clockRows(o)
	want := map[string]time.Duration{"node-1": 0, "node-2": 5 * time.Minute, "node-3": -300 * time.Millisecond}
	for _, r := range rows {
		if w, ok := want[r.node]; ok && (r.unknown || r.offset != w) {
			t.Errorf("%s: offset %v (unknown %v), want %v", r.node, r.offset, r.unknown, w)
		}
		if r.node == "node-4" && !r.unknown {
			t.Errorf("node-4 was never measured: %+v", r)
		}
	}
	var b bytes.Buffer
	printClock(&b, o)
	out := b.String()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "node-2") != strings.Contains(line, "OUT OF BOUND") {
			t.Errorf("line %q: only node-2 is out of bound", line)
		}
	}
	if !strings.Contains(out, "not measured: connection refused") {
		t.Errorf("node-4's probe error missing:\n%s", out)
	}
}

// TestPrintClockNotConfirmed: a node within bound of the median that no
// majority of clocks confirms (two live clocks 30 minutes apart) is marked
// and its reason printed.
func TestPrintClockNotConfirmed(t *testing.T) {
	why := "clock not confirmed: only 1 of the 3 voters' clocks (this one included) are within the max clock offset 1s of this node's"
	o := &api.ClockOffsetsResponse{NodeId: "node-1", MaxOffsetNanos: int64(time.Second), InBound: false, Reason: why,
		Peers: []*api.PeerOffset{{NodeId: "node-3", OffsetNanos: -int64(30 * time.Minute), RttNanos: int64(time.Millisecond), AgeNanos: int64(time.Second)}}}
	var b bytes.Buffer
	printClock(&b, o)
	out := b.String()
	if !strings.Contains(out, why) {
		t.Errorf("reason missing:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "node-1 ") && !strings.Contains(line, "NOT CONFIRMED") {
			t.Errorf("line %q: node-1 is not confirmed", line)
		}
	}
}
