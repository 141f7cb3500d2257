package server

import (
	"testing"
	"time"
)

// TestIdleTimeoutNeverEarly: a series seen within the idle timeout is active.
// Minutes are whole, so a series acknowledged at :50 must survive
// the next minute boundary with a 1-minute timeout, and its re-send must be
// accepted even when the tenant filled up meanwhile. It goes idle within one
// minute after the timeout, never before it.
func TestIdleTimeoutNeverEarly(t *testing.T) {
	clk := newTestClock()
	// :50 within a minute.
	clk.unix.Store((clk.unix.Load()/60)*60 + 50)
	s, c := startServer(t, t.TempDir(), func(c *Config) {
		c.Clock.Now = clk.Now
		c.Tracking.IdleTimeout = time.Minute
		c.Shares.Mode = ShareStatic // one group's fixed share (movable shares: shares_test.go)
	})
	defer stop(t, s)
	start := clk.Now().Unix() / 60

	first := hashesIn(30, 0, 1)
	if rej := track(t, c, "t1", 0, first); len(rej) != 0 {
		t.Fatal("first series rejected")
	}

	clk.Advance(11 * time.Second) // :01 of the next minute: seen 11 s ago
	waitFor(t, "the leader to stamp the next minute", func() bool { return s.FSM(0).Now() == start+1 })
	others := hashesIn(31, 0, 16) // share is 16: at most 15 of these fit beside the first
	rej := track(t, c, "t1", 0, others)
	if got := s.FSM(0).TenantActive("t1"); got != 16 {
		t.Fatalf("active = %d after filling, want 16 (first series + 15 others; %d rejected)", got, len(rej))
	}
	if rej := track(t, c, "t1", 0, first); len(rej) != 0 {
		t.Fatal("a series seen 11 s ago was rejected with a 1-minute idle timeout: it expired early")
	}

	// 71 s after it was last seen (the re-send above refreshed it at start+1:01,
	// so advance past start+2's boundary plus a minute): idle now, and the
	// others seen at start+1 are still active.
	clk.Advance(2 * time.Minute) // start+3:01: first seen 120 s ago, others too
	waitFor(t, "idle series to expire", func() bool { return s.FSM(0).TenantActive("t1") == 0 })
}
