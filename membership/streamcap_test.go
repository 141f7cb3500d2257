package membership

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// idleFrom opens a TCP connection to addr from loopback address src
// (Linux routes the whole 127/8 to lo) and sends nothing.
func idleFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer reads from c until the node closes it (an error other
// than the read deadline).
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}
}

// TestStreamCap: idle TCP connections to the gossip port hold at most
// MaxStreams stream slots, a quarter of them per address; connections
// beyond are closed on accept and counted. Another member still joins
// (push-pull over TCP) while one address floods, and gossip still
// converges while every slot is taken.
func TestStreamCap(t *testing.T) {
	a, err := New(Config{NodeID: "a", Zone: "zone-a", GRPCAddr: "a:1", RaftAddr: "a:2", BindAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, DataDir: t.TempDir(), MaxStreams: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown() })
	b := start(t, "b", "zone-b")
	c := start(t, "c", "zone-c")
	addr := a.GossipAddr()

	// One address: 2 slots (a quarter of 8), then refusals. memberlist
	// closes an idle stream after its TCP timeout (10s), so this part
	// must run within that; it takes milliseconds.
	for range 2 {
		idleFrom(t, "127.0.0.2", addr)
	}
	waitFor(t, "2 streams open", func() bool { return a.StreamStats().Open == 2 })
	for i := range 10 {
		if !closedByPeer(idleFrom(t, "127.0.0.2", addr)) {
			t.Fatalf("connection %d over the per-address cap was not closed", i)
		}
	}
	if s := a.StreamStats(); s.Refused < 10 || s.Open > 2 {
		t.Fatalf("after 10 connections over the per-address cap: %+v, want ≥ 10 refused and ≤ 2 open", s)
	}
	// b (127.0.0.1) joins a: its push-pull stream gets a slot.
	if _, err := b.Join([]string{addr}); err != nil {
		t.Fatalf("join while one address floods: %v", err)
	}

	// Every slot taken: 127.0.0.3-5 fill the cap.
	for _, src := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		for range 2 {
			idleFrom(t, src, addr)
		}
	}
	refused := a.StreamStats().Refused
	for range 4 {
		idleFrom(t, "127.0.0.6", addr)
	}
	waitFor(t, "connections over the node's cap refused", func() bool { return a.StreamStats().Refused > refused })
	if s := a.StreamStats(); s.Open > 8 {
		t.Fatalf("%d streams open, cap 8", s.Open)
	}
	// c joins through b; a learns of it by gossip (UDP).
	if _, err := c.Join([]string{b.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 alive members on a", func() bool { return countStatus(a.Members(), StatusAlive) == 3 })
	waitFor(t, "3 alive members on c", func() bool { return countStatus(c.Members(), StatusAlive) == 3 })
}

// TestStreamCapConfig: a negative cap is refused with the field named.
func TestStreamCapConfig(t *testing.T) {
	_, err := New(Config{NodeID: "a", Zone: "z", GRPCAddr: "a:1", RaftAddr: "a:2", BindAddr: "127.0.0.1:0", MaxStreams: -1})
	if err == nil || !strings.Contains(err.Error(), "MaxStreams") {
		t.Fatalf("MaxStreams -1: %v", err)
	}
}
