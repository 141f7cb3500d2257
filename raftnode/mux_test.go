package raftnode

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

const ioTimeout = 5 * time.Second

func newTestMux(t *testing.T, cfg MuxConfig, groups ...int) (*Mux, []*GroupLayer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t, slog.LevelDebug)
	}
	m, err := NewMux(ln, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	layers := make([]*GroupLayer, len(groups))
	for i, g := range groups {
		if layers[i], err = m.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	m.Start()
	return m, layers
}

// acceptTimeout runs l.Accept with a bound.
func acceptTimeout(t *testing.T, l *GroupLayer) net.Conn {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("accept on group %d: %v", l.Group(), r.err)
		}
		return r.c
	case <-time.After(ioTimeout):
		t.Fatalf("accept on group %d: timed out", l.Group())
		return nil
	}
}

// roundTrip dials group g of server from client layer, accepts it, and
// checks bytes flow both ways.
func roundTrip(t *testing.T, client, server *GroupLayer, addr net.Addr) {
	t.Helper()
	c, err := client.Dial(raft.ServerAddress(addr.String()), ioTimeout)
	if err != nil {
		t.Fatalf("dial group %d: %v", client.Group(), err)
	}
	defer c.Close()
	s := acceptTimeout(t, server)
	defer s.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	_ = s.SetDeadline(time.Now().Add(ioTimeout))

	msg := fmt.Sprintf("hello group %d", client.Group())
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatalf("server read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("group %d server got %q, want %q", server.Group(), buf, msg)
	}
	if _, err := s.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf[:2]); err != nil || string(buf[:2]) != "ok" {
		t.Fatalf("client read: %q %v", buf[:2], err)
	}
}

// expectClosed reads from c until the peer closes it; a timeout fails.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	buf := make([]byte, 256)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // e.g. a TLS alert before the close
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection was not closed by the server within %v", ioTimeout)
		}
		return
	}
}

func rawHeader(magic string, version byte, group uint16) []byte {
	return append([]byte(magic), version, byte(group>>8), byte(group))
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, g := range []int{0, 1, 255, 256, MaxGroups - 1} {
		got, err := decodeHeader(encodeHeader(g))
		if err != nil || got != g {
			t.Fatalf("group %d: got %d, %v", g, got, err)
		}
	}
	h := encodeHeader(3)
	h[0] = 'X'
	if _, err := decodeHeader(h); err == nil {
		t.Fatal("bad magic accepted")
	}
	h = encodeHeader(3)
	h[4] = 4
	if _, err := decodeHeader(h); err == nil {
		t.Fatal("bad version accepted")
	}
}

func TestMuxRoutesGroups(t *testing.T) {
	srv, sl := newTestMux(t, MuxConfig{}, 0, 1, 2, 300)
	_, cl := newTestMux(t, MuxConfig{}, 0, 1, 2, 300)
	for i := range sl {
		roundTrip(t, cl[i], sl[i], srv.Addr())
	}
	// Interleaved: dial all, then accept all; each lands on its own group.
	conns := make([]net.Conn, len(cl))
	for i := range cl {
		c, err := cl[i].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for i := len(sl) - 1; i >= 0; i-- {
		s := acceptTimeout(t, sl[i])
		_ = s.SetReadDeadline(time.Now().Add(ioTimeout))
		b := make([]byte, 1)
		if _, err := io.ReadFull(s, b); err != nil || int(b[0]) != i {
			t.Fatalf("layer %d got %v %v", i, b, err)
		}
		s.Close()
	}
}

func TestMuxRegister(t *testing.T) {
	m, _ := newTestMux(t, MuxConfig{}, 0)
	if _, err := m.Register(0); err == nil {
		t.Fatal("double register accepted")
	}
	if _, err := m.Register(-1); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("register -1: %v", err)
	}
	if _, err := m.Register(MaxGroups); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("register MaxGroups: %v", err)
	}
}

func TestMuxRejectsBadConnections(t *testing.T) {
	srv, sl := newTestMux(t, MuxConfig{HandshakeTimeout: 300 * time.Millisecond}, 0, 1)
	_, cl := newTestMux(t, MuxConfig{}, 0, 1, 7)

	cases := []struct {
		name string
		send []byte
	}{
		{"bad magic", rawHeader("HTTP", 1, 0)},
		{"bad version", rawHeader("TGRF", 9, 0)},
		{"unknown group", rawHeader("TGRF", 1, 7)},
		{"short header then close", []byte("TG")},
		{"silent", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", srv.Addr().String(), ioTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.send != nil {
				if _, err := c.Write(tc.send); err != nil {
					t.Fatal(err)
				}
			}
			if tc.name == "short header then close" {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			// While the bad connection is pending, other groups work.
			roundTrip(t, cl[1], sl[1], srv.Addr())
			expectClosed(t, c)
			roundTrip(t, cl[0], sl[0], srv.Addr())
		})
	}

	// Through the real dialer too: group 7 is not registered on srv.
	c, err := cl[2].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	expectClosed(t, c)
	roundTrip(t, cl[0], sl[0], srv.Addr())
}

func TestMuxLayerCloseIsolated(t *testing.T) {
	srv, sl := newTestMux(t, MuxConfig{}, 0, 1, 2)
	_, cl := newTestMux(t, MuxConfig{}, 0, 1, 2)

	// An established group-1 connection is closed with its layer.
	c1, err := cl[1].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	s1 := acceptTimeout(t, sl[1])
	defer s1.Close()

	acceptErr := make(chan error, 1)
	go func() {
		_, err := sl[1].Accept()
		acceptErr <- err
	}()
	if err := sl[1].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("accept after close: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Accept not unblocked by Close")
	}
	if err := sl[1].Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	expectClosed(t, c1)

	// New connections for group 1 are rejected; groups 0 and 2 still work.
	c, err := cl[1].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	expectClosed(t, c)
	roundTrip(t, cl[0], sl[0], srv.Addr())
	roundTrip(t, cl[2], sl[2], srv.Addr())

	// The id can be registered again.
	again, err := srv.Register(1)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, cl[1], again, srv.Addr())

	// A closed client layer cannot dial.
	if err := cl[2].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cl[2].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout); err == nil {
		t.Fatal("dial on closed layer succeeded")
	}
}

func TestMuxClose(t *testing.T) {
	srv, sl := newTestMux(t, MuxConfig{}, 0, 1)
	_, cl := newTestMux(t, MuxConfig{}, 0)

	c, err := cl[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := acceptTimeout(t, sl[0])
	defer s.Close()
	// A pending (silent) connection is closed too.
	silent, err := net.DialTimeout("tcp", srv.Addr().String(), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	acceptErr := make(chan error, 1)
	go func() {
		_, err := sl[1].Accept()
		acceptErr <- err
	}()
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Mux.Close hung")
	}
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("accept after mux close: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Accept not unblocked by Mux.Close")
	}
	expectClosed(t, c)
	expectClosed(t, silent)
	if err := srv.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := srv.Register(5); err == nil {
		t.Fatal("register after close succeeded")
	}
	if _, err := cl[0].Dial(raft.ServerAddress(srv.Addr().String()), time.Second); err == nil {
		t.Fatal("dial to closed mux succeeded")
	}
}

func TestMuxAdvertiseAddr(t *testing.T) {
	m, l := newTestMux(t, MuxConfig{AdvertiseAddr: "raft-0.example:7301"}, 0)
	if got := m.Addr().String(); got != "raft-0.example:7301" {
		t.Fatalf("Addr = %q", got)
	}
	if got := l[0].Addr().String(); got != "raft-0.example:7301" {
		t.Fatalf("layer Addr = %q", got)
	}
	if m.ListenAddr().String() == m.Addr().String() {
		t.Fatal("ListenAddr should be the bound address")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := NewMux(ln, MuxConfig{AdvertiseAddr: "no-port"}); err == nil {
		t.Fatal("bad advertise address accepted")
	}
}

func TestMuxTLS(t *testing.T) {
	serverTLS, clientTLS := testCerts(t)
	srv, sl := newTestMux(t, MuxConfig{ServerTLS: serverTLS, ClientTLS: clientTLS, HandshakeTimeout: time.Second}, 0, 1)
	_, cl := newTestMux(t, MuxConfig{ServerTLS: serverTLS, ClientTLS: clientTLS}, 0, 1)

	roundTrip(t, cl[0], sl[0], srv.Addr())
	roundTrip(t, cl[1], sl[1], srv.Addr())

	// The accepted conn really is TLS.
	c, err := cl[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := acceptTimeout(t, sl[0])
	defer s.Close()
	if _, ok := s.(*trackedConn).Conn.(*tls.Conn); !ok {
		t.Fatalf("accepted conn is %T, want *tls.Conn", s.(*trackedConn).Conn)
	}

	// A plaintext client is rejected; TLS groups keep working.
	_, plain := newTestMux(t, MuxConfig{}, 0)
	pc, err := plain[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	expectClosed(t, pc)

	// A client that does not trust the server's certificate fails to dial.
	_, otherClient := testCerts(t)
	_, untrusting := newTestMux(t, MuxConfig{ClientTLS: otherClient}, 0)
	if _, err := untrusting[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout); err == nil {
		t.Fatal("dial with untrusted server certificate succeeded")
	}
	// A client without a certificate is refused by the server (mutual TLS).
	noCert := clientTLS.Clone()
	noCert.Certificates = nil
	_, anon := newTestMux(t, MuxConfig{ClientTLS: noCert}, 0)
	if ac, err := anon[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout); err == nil {
		// With TLS 1.3 the client may finish its handshake before the server
		// rejects the missing certificate; the server then closes.
		expectClosed(t, ac)
		ac.Close()
	}
	roundTrip(t, cl[1], sl[1], srv.Addr())
}

// TestMuxClusterKey: with a cluster key the listener hands a connection to
// its group only after a version 3 header whose MAC verifies; a dialer
// without the key (version 1 or 2 headers), one with another key, and a
// replayed header are closed before raft sees them. Layers with the key
// round-trip as before, also after a key rotation (the listener verifies
// with every key of its ring).
func TestMuxClusterKey(t *testing.T) {
	key := []byte("cluster key for the mux test 32b")
	other := []byte("another cluster's key, 32 bytes!")
	srv, sl := newTestMux(t, MuxConfig{ClusterKeys: [][]byte{other, key}, HandshakeTimeout: 300 * time.Millisecond}, 0)
	_, keyed := newTestMux(t, MuxConfig{ClusterKeys: [][]byte{key}}, 0)
	roundTrip(t, keyed[0], sl[0], srv.Addr())

	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := sl[0].Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	refused := func(name string, dial func() (net.Conn, error)) {
		t.Helper()
		c, err := dial()
		if err != nil {
			return // refused while dialling: fine
		}
		defer c.Close()
		select {
		case r := <-accepted:
			r.Close()
			t.Fatalf("%s: the connection reached the group", name)
		case <-time.After(500 * time.Millisecond):
		}
		expectClosed(t, c)
	}
	_, plain := newTestMux(t, MuxConfig{}, 0)
	refused("no key", func() (net.Conn, error) { return plain[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout) })
	_, wrong := newTestMux(t, MuxConfig{ClusterKeys: [][]byte{[]byte("a third key nobody uses, 32 byte")}}, 0)
	refused("wrong key", func() (net.Conn, error) { return wrong[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout) })

	// A header captured on the wire and sent again.
	hdr := append(rawHeader("TGRF", 3, 0), make([]byte, 16)...)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(time.Now().UnixMilli()))
	hdr = append(hdr, []byte("0123456789abcdef")...)
	hdr = append(hdr, headerMAC(key, hdr)...)
	send := func() (net.Conn, error) {
		c, err := net.DialTimeout("tcp", srv.Addr().String(), ioTimeout)
		if err == nil {
			_, err = c.Write(hdr)
		}
		return c, err
	}
	c, err := send()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-accepted:
		r.Close()
	case <-time.After(ioTimeout):
		t.Fatal("a header made with the cluster key was refused")
	}
	c.Close()
	refused("replayed header", send)
}

// dialFrom opens a TCP connection to addr from loopback address src
// (127.0.0.x: Linux routes the whole 127/8 to lo), sending nothing.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: ioTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestMuxPendingCap: connections that never send their header hold a
// pending slot; beyond MaxPendingConnsPerHost from one address, and
// beyond MaxPendingConns in all, new connections are closed on accept and
// counted. A peer with the cluster key still connects while one address
// floods, its established connection keeps working while the whole cap is
// full, and slots come back when the idle connections go.
func TestMuxPendingCap(t *testing.T) {
	key := []byte("cluster key for the mux test 32b")
	// A long handshake timeout: the idle connections stay pending for the
	// whole test, so nothing here depends on timing.
	srv, sl := newTestMux(t, MuxConfig{ClusterKeys: [][]byte{key}, HandshakeTimeout: time.Hour,
		MaxPendingConns: 12, MaxPendingConnsPerHost: 4}, 0)
	_, peer := newTestMux(t, MuxConfig{ClusterKeys: [][]byte{key}}, 0)
	addr := srv.ListenAddr().String()
	waitStats := func(what string, ok func(MuxStats) bool) {
		t.Helper()
		deadline := time.Now().Add(ioTimeout)
		for !ok(srv.Stats()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: stats %+v", what, srv.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// An established peer connection, before any flood.
	est, err := peer[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer est.Close()
	estSrv := acceptTimeout(t, sl[0])
	defer estSrv.Close()

	// One address: 4 pending, then every further connection is closed.
	var idle []net.Conn
	for range 4 {
		idle = append(idle, dialFrom(t, "127.0.0.2", addr))
	}
	waitStats("4 idle connections pending", func(s MuxStats) bool { return s.Pending == 4 })
	for range 10 {
		expectClosed(t, dialFrom(t, "127.0.0.2", addr))
	}
	waitStats("10 refused from one address", func(s MuxStats) bool { return s.Refused == 10 })
	if s := srv.Stats(); s.Pending != 4 {
		t.Fatalf("pending %d after refusals, want 4", s.Pending)
	}
	// The peer (127.0.0.1) is not that address: it still connects.
	roundTrip(t, peer[0], sl[0], srv.Addr())

	// Two more addresses fill the node's cap of 12: a fourth is refused,
	// and so is the peer's new connection, but its established one works.
	for _, src := range []string{"127.0.0.3", "127.0.0.4"} {
		for range 4 {
			idle = append(idle, dialFrom(t, src, addr))
		}
	}
	waitStats("12 pending", func(s MuxStats) bool { return s.Pending == 12 })
	expectClosed(t, dialFrom(t, "127.0.0.5", addr))
	waitStats("refused at the node's cap", func(s MuxStats) bool { return s.Refused == 11 })
	if c, err := peer[0].Dial(raft.ServerAddress(srv.Addr().String()), ioTimeout); err == nil {
		expectClosed(t, c)
		c.Close()
	}
	waitStats("the peer's new connection refused at the cap", func(s MuxStats) bool { return s.Refused == 12 })
	_ = est.SetDeadline(time.Now().Add(ioTimeout))
	_ = estSrv.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := est.Write([]byte("raft")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(estSrv, buf); err != nil || string(buf) != "raft" {
		t.Fatalf("established connection under a full cap: %q %v", buf, err)
	}

	// The idle connections go: their slots come back, and the peer dials.
	for _, c := range idle {
		c.Close()
	}
	waitStats("slots freed", func(s MuxStats) bool { return s.Pending == 0 })
	roundTrip(t, peer[0], sl[0], srv.Addr())
}

// TestMuxPendingCapConfig: negative caps are refused with the field named.
func TestMuxPendingCapConfig(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = NewMux(ln, MuxConfig{MaxPendingConns: -1})
	if err == nil || !strings.Contains(err.Error(), "MaxPendingConns") {
		t.Fatalf("MaxPendingConns -1: %v", err)
	}
}
