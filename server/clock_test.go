package server

import (
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
