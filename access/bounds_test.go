package access

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cappedHTTP is a real HTTP server on loopback behind a ConnCap, as the
// node runs its HTTP port: /slow reads its whole body, /healthz answers.
type cappedHTTP struct {
	cap  *ConnCap
	addr string
}

func startCappedHTTP(t *testing.T, max int) *cappedHTTP {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := NewConnCap(lis, max)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /slow", func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ConnState: c.ConnState}
	go func() { _ = srv.Serve(c) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &cappedHTTP{cap: c, addr: lis.Addr().String()}
}

// slowRequests opens n connections whose requests never finish (a body of
// 1,000 bytes, one sent) and waits until the cap counts them in progress.
// startFullAnsweringHealth starts a server capped at n connections that
// answers liveness checks beyond its cap, and fills it with n requests in
// progress that are never old enough to displace.
func startFullAnsweringHealth(t *testing.T, n int) *cappedHTTP {
	s := startCappedHTTP(t, n)
	s.cap.AnswerHealthBeyondCap()
	s.cap.mu.Lock()
	s.cap.minBusy = time.Hour // every request is young: nothing to displace
	s.cap.mu.Unlock()
	s.slowRequests(t, n)
	return s
}

// closedUnanswered connects, sends send, and fails the test unless the node
// closes the connection without answering (what names the connection).
func (s *cappedHTTP) closedUnanswered(t *testing.T, send, what string) {
	t.Helper()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, send)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: read %d bytes, %v; want it closed by the node unanswered", what, n, err)
	}
}

func (s *cappedHTTP) slowRequests(t *testing.T, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
		fmt.Fprint(c, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	}
	waitFor(t, fmt.Sprintf("%d requests in progress", n), func() bool {
		s.cap.mu.Lock()
		defer s.cap.mu.Unlock()
		busy := 0
		for _, st := range s.cap.conns {
			if st.idleSince.IsZero() {
				busy++
			}
		}
		return busy == n
	})
	return conns
}

// waitFor polls cond until it holds (a condition, not a timed assertion:
// the deadline only catches a hang).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHTTPConnectionCapBusy: with every connection inside a request, one
// more displaces the request in progress longest once it is older than
// minBusyAge (slow requests cannot lock /healthz out), and is closed on
// accept instead of queued while every request is younger.
func TestHTTPConnectionCapBusy(t *testing.T) {
	s := startCappedHTTP(t, 8)
	s.cap.mu.Lock()
	s.cap.minBusy = time.Hour // every request is young: refuse
	s.cap.mu.Unlock()
	slow := s.slowRequests(t, 8)
	s.closedUnanswered(t, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "a connection beyond the cap")
	if s.cap.refused.Load() == 0 {
		t.Fatal("refusal not counted")
	}

	// Requests older than minBusy give way to a health check.
	s.cap.mu.Lock()
	s.cap.minBusy = 0
	s.cap.mu.Unlock()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + s.addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with every connection in a slow request: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || s.cap.evicted.Load() == 0 {
		t.Fatalf("/healthz: %d, evicted %d", resp.StatusCode, s.cap.evicted.Load())
	}
	// The oldest slow request was closed (any of the 8 may be the oldest:
	// one not closed waits out the deadline).
	_ = slow[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := slow[0].Read(make([]byte, 1)); err == nil {
		t.Log("the first slow request got an answer before its eviction") // possible: any one of the 8 may be oldest
	}
}

// TestHTTPCapAnswersHealthBeyondCap: with every connection inside a young
// request (nothing to displace), a liveness check beyond the cap is
// answered by the cap itself when AnswerHealthBeyondCap is on, where it was
// closed; any other request, and a connection that sends nothing, is still
// closed and counted refused.
func TestHTTPCapAnswersHealthBeyondCap(t *testing.T) {
	s := startFullAnsweringHealth(t, 4)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req, _ := http.NewRequest(method, "http://"+s.addr+"/healthz?verbose=1", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s /healthz beyond the cap: %v", method, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := "ok\n"
		if method == http.MethodHead {
			want = ""
		}
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Fatalf("%s /healthz beyond the cap: %d %q, want 200 %q", method, resp.StatusCode, body, want)
		}
	}
	// Counted once the answer is written: the client may read it first.
	waitFor(t, "2 liveness checks answered at the cap", func() bool { return s.cap.HealthAnsweredBeyondCap() == 2 })
	if got := s.cap.Evicted(); got != 0 {
		t.Fatalf("%d connections evicted, want 0 (the checks were answered beside the cap)", got)
	}
	refused := s.cap.Refused()
	for _, send := range []string{"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", "POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n", ""} {
		s.closedUnanswered(t, send, fmt.Sprintf("%q beyond the cap", send))
	}
	waitFor(t, "the three refusals counted", func() bool { return s.cap.Refused() == refused+3 })
}

// TestHTTPCapTriageMakesRoomForHealthChecks: with every place for reading
// request heads beyond the cap held by connections whose heads are still
// incomplete (silent, or trickling), a liveness check still gets one (the
// place taken longest ago gives way) and is answered.
func TestHTTPCapTriageMakesRoomForHealthChecks(t *testing.T) {
	s := startFullAnsweringHealth(t, 2)
	const places = 32 // (of maxBeyondCap: fewer file descriptors)
	s.cap.tmu.Lock()
	s.cap.beyondWait = time.Hour // the places stay held
	s.cap.places = places
	s.cap.tmu.Unlock()
	held := func() int {
		s.cap.tmu.Lock()
		defer s.cap.tmu.Unlock()
		return len(s.cap.triaging)
	}
	var first []net.Conn // the first holders: closed when they give way
	hold := func(send string) {
		for range places {
			c, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			fmt.Fprint(c, send)
			if send == "" {
				first = append(first, c)
			}
		}
		waitFor(t, "every place taken", func() bool { return held() == places })
	}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i, send := range []string{"", "GET /healthz HTTP/1.1\r\nX-Slow: "} {
		hold(send)
		resp, err := client.Get("http://" + s.addr + "/healthz")
		if err != nil {
			t.Fatalf("/healthz with every place held by %q: %v", send, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz with every place held by %q: %d, want 200", send, resp.StatusCode)
		}
		waitFor(t, "the check counted as answered by the cap", func() bool { return s.cap.HealthAnsweredBeyondCap() == uint64(i+1) })
	}
	// The second holders took the first ones' places, oldest first: the
	// first holder of all was closed.
	if r := s.cap.Refusals(); r.GaveWay < places {
		t.Fatalf("%d places given way, want at least %d (the first holders, to the second)", r.GaveWay, places)
	}
	_ = first[0].SetReadDeadline(time.Now().Add(20 * time.Second))
	var ne net.Error
	if n, err := first[0].Read(make([]byte, 64)); n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("the first silent holder: read %d bytes, %v; want it closed", n, err)
	}
}

// TestStreamLimiter: one client is refused at its own bound while others
// still get slots, the node's total bound refuses everyone, both with
// ResourceExhausted naming the bound, and a release frees the slot.
func TestStreamLimiter(t *testing.T) {
	b := Bounds{MaxWatchStreams: 3, MaxWatchStreamsPerClient: 2}
	if err := b.SetDefaults(); err != nil {
		t.Fatal(err)
	}
	l := newStreamLimiter(b)
	relA1, err := l.acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.acquire("a"); err != nil {
		t.Fatal(err)
	}
	_, err = l.acquire("a")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "client a holds 2") {
		t.Fatalf("a's third stream: %v, want ResourceExhausted naming the per-client bound", err)
	}
	if _, err := l.acquire("b"); err != nil {
		t.Fatalf("b's first stream beside a's two: %v", err)
	}
	_, err = l.acquire("c")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 3 watch streams") {
		t.Fatalf("a fourth stream on the node: %v, want ResourceExhausted naming the node's bound", err)
	}
	relA1()
	if _, err := l.acquire("c"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if n := l.open.Load(); n != 3 {
		t.Fatalf("open %d, want 3", n)
	}
}

// TestBoundsDefaults: zero fields take the defaults; a negative one is
// refused with an error naming the bounds.
func TestBoundsDefaults(t *testing.T) {
	var b Bounds
	if err := b.SetDefaults(); err != nil {
		t.Fatal(err)
	}
	if b.HTTPMaxConns != 4096 || b.GRPCMaxConnsPerPeer != max(b.GRPCMaxConns/2, 1) || b.MaxWatchStreamsPerClient != 1000 || b.WatchSendTimeout != 30*time.Second {
		t.Fatalf("defaults: %+v", b)
	}
	bad := Bounds{HTTPReadTimeout: -time.Second}
	if err := bad.SetDefaults(); err == nil || !strings.Contains(err.Error(), "bounds") {
		t.Fatalf("negative timeout: %v, want an error naming the bounds", err)
	}
}
