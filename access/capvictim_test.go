package access

import (
	"net"
	"testing"
	"time"
)

// TestHTTPCapEvictsFromTheBusiestAddress: at the HTTP connection cap, a
// new connection displaces an idle connection of the address holding the
// most idle ones, not the longest-idle connection overall: a health
// check's fresh connection (idle until its request is read) survives a
// burst of idle connections from another address.
func TestHTTPCapEvictsFromTheBusiestAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := NewConnCap(ln, 4)
	defer c.Close()
	dial := func(src string) net.Conn { srv, _ := capDial(t, c, src, ""); return srv }
	check := dial("127.0.0.1") // the oldest idle connection
	for range 3 {
		dial("127.0.0.2")
	}
	for i := range 20 { // a flood from 127.0.0.2 beyond the cap
		dial("127.0.0.2")
		c.mu.Lock()
		_, kept := c.conns[check]
		n := len(c.conns)
		c.mu.Unlock()
		if !kept {
			t.Fatalf("flood connection %d displaced the other address's connection", i)
		}
		if n != 4 {
			t.Fatalf("%d connections held, cap 4", n)
		}
	}
	if got := c.evicted.Load(); got != 20 {
		t.Fatalf("evicted %d, want 20", got)
	}
	// With the flood's address no longer the busiest, the oldest idle
	// connection of the busiest one goes: 127.0.0.3 brings 3.
	c.mu.Lock()
	for k, st := range c.conns {
		if st.ip == "127.0.0.2" {
			delete(c.conns, k)
		}
	}
	c.mu.Unlock()
	for range 3 {
		dial("127.0.0.3")
	}
	dial("127.0.0.1")
	c.mu.Lock()
	_, kept := c.conns[check]
	c.mu.Unlock()
	if !kept {
		t.Fatal("127.0.0.1's connection displaced while 127.0.0.3 held more idle ones")
	}
}

// TestHTTPCapSparesFreshConnections: at the cap, a connection accepted
// less than minBusy ago that has not sent a request (a health check not
// read yet) is displaced only after every request in progress longer than
// minBusy, and after keep-alive idle connections.
func TestHTTPCapSparesFreshConnections(t *testing.T) {
	c := &ConnCap{max: 4, conns: map[net.Conn]*capState{}, minBusy: time.Second}
	conn := func() net.Conn {
		a, b := net.Pipe() // keys of the books only: nothing is read or written
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a
	}
	now := time.Now()
	probe, slow1, slow2, young := conn(), conn(), conn(), conn()
	c.conns[probe] = &capState{idleSince: now, ip: "127.0.0.1"}
	c.conns[slow1] = &capState{activeSince: now.Add(-5 * time.Second), ip: "127.0.0.1"}
	c.conns[slow2] = &capState{activeSince: now.Add(-3 * time.Second), ip: "127.0.0.1"}
	c.conns[young] = &capState{activeSince: now, ip: "127.0.0.1"}
	if v := c.victimLocked(); v != slow1 {
		t.Fatalf("victim %v, want the oldest slow request", v)
	}
	keep := conn()
	c.conns[keep] = &capState{idleSince: now.Add(-10 * time.Millisecond), activeSince: now.Add(-20 * time.Millisecond), ip: "127.0.0.2"}
	if v := c.victimLocked(); v != keep {
		t.Fatalf("victim %v, want the keep-alive idle connection", v)
	}
	delete(c.conns, keep)
	delete(c.conns, slow1)
	delete(c.conns, slow2)
	// Only the fresh probe and a young request: the probe goes (the new
	// connection is admitted rather than refused).
	if v := c.victimLocked(); v != probe {
		t.Fatalf("victim %v, want the fresh connection", v)
	}
	delete(c.conns, probe)
	if v := c.victimLocked(); v != nil {
		t.Fatalf("victim %v with only a young request, want none (refuse)", v)
	}
}

// capDial connects to c's listener from src, sends send, and accepts the
// connection through the cap: the server's side and the client's.
func capDial(t *testing.T, c *ConnCap, src, send string) (srv, cl net.Conn) {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	cl, err := d.Dial("tcp", c.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if send != "" {
		if _, err := cl.Write([]byte(send)); err != nil {
			t.Fatal(err)
		}
	}
	srv, err = c.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, cl
}
