package server

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
	c := newConnCap(ln, 4)
	defer c.Close()
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		cl, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		srv, err := c.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		return srv
	}
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
