package access

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/stats"
)

// TestGRPCCapEvictionOrder: at the cap, a connection that never carried a
// call goes before one that did, a connection in a call is never closed
// (the new one is refused instead), and the per-peer bound evicts within
// the peer. The busy marks come from the cap's stats handler, called here
// as gRPC calls it (the flood test drives it through a real server).
func TestGRPCCapEvictionOrder(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPCCap(lis, 2, 2)
	defer g.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := g.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() (client, server net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case s := <-accepted:
			return c, s
		case <-time.After(3 * time.Second): // refused: the listener closed it and accepts the next
			return c, nil
		}
	}
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return err != nil && !(ok && ne.Timeout())
	}
	h := g.StatsHandler()
	call := func(s net.Conn, begin bool) {
		ctx := h.TagConn(context.Background(), &stats.ConnTagInfo{RemoteAddr: s.RemoteAddr()})
		if begin {
			h.HandleRPC(ctx, &stats.Begin{})
		} else {
			h.HandleRPC(ctx, &stats.End{})
		}
	}
	c1, s1 := dial()
	time.Sleep(10 * time.Millisecond)
	c2, _ := dial()
	call(s1, true)
	call(s1, false) // s1 carried a call; s2 never did
	c3, s3 := dial()
	if s3 == nil || !closed(c2) {
		t.Fatal("at the cap, the never-used connection was not the one closed")
	}
	// s1 and s3 open; put both in a call: a fourth is refused.
	call(s1, true)
	call(s3, true)
	c4, s4 := dial()
	if s4 != nil || !closed(c4) {
		t.Fatal("with every connection in a call, a new one was admitted")
	}
	if g.Refused() == 0 || g.Evicted() != 1 {
		t.Fatalf("refused %d, evicted %d", g.Refused(), g.Evicted())
	}
	_ = c1
	_ = c3
}
