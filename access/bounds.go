package access

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Bounds are the resources one client may hold on a node: what a node
// grants before it refuses, so that idle connections, unread streams or
// slow bodies from one client cannot take the node down for everyone. Zero
// fields take the defaults below.
type Bounds struct {
	// HTTPMaxConns caps open HTTP connections (default 4096). At the cap a
	// new connection evicts the longest-idle one (idle keep-alive, or never
	// sent a request); with none idle it is closed at once.
	HTTPMaxConns int
	// HTTPReadTimeout bounds reading a request, body included (default
	// 30s); HTTPWriteTimeout writing the answer (default 2m: a CPU profile
	// takes 30s); HTTPIdleTimeout a keep-alive connection between requests
	// (default 60s). Headers must arrive within 10s and hold at most
	// HTTPMaxHeaderBytes (default 64 KiB); bodies are bounded per endpoint.
	HTTPReadTimeout    time.Duration
	HTTPWriteTimeout   time.Duration
	HTTPIdleTimeout    time.Duration
	HTTPMaxHeaderBytes int
	// GRPCMaxStreamsPerConn is the HTTP/2 concurrent-stream limit a gRPC
	// connection is given (default 1000).
	GRPCMaxStreamsPerConn uint32
	// GRPCMaxConns caps open gRPC connections (default a quarter of the
	// file descriptor limit, at most 10,000), GRPCMaxConnsPerPeer those
	// from one IP address (default half of GRPCMaxConns). At a cap the
	// connection quiet longest with no call in progress (one that never
	// carried a call first) is closed to admit the new one; with all in a
	// call the new one is closed at once. The descriptors above the cap
	// stay for raft, gossip, the HTTP port and the data files.
	GRPCMaxConns        int
	GRPCMaxConnsPerPeer int
	// GRPCIdleTimeout closes a gRPC connection with no call for this long
	// (default 5m; clients reconnect on their next call). A connection
	// must finish its TLS and HTTP/2 handshakes within 10s.
	GRPCIdleTimeout time.Duration
	// MaxWatchStreams bounds the long-lived streams (WatchCluster,
	// WatchSummaries, WatchSketches, RateLimit.Sync) open on the node
	// (default 10,000);
	// MaxWatchStreamsPerClient those of one client (its credential, or its
	// IP address without one; default 1,000). Beyond, ResourceExhausted.
	MaxWatchStreams          int
	MaxWatchStreamsPerClient int
	// WatchSendTimeout is how long one message of a watch stream may wait
	// for its client to read (default 30s). gRPC's flow control blocks a
	// send once the client stops reading and the stream's window and write
	// buffer (64 KiB each) are full; a send blocked longer than this ends
	// the stream with ResourceExhausted "slow reader", which frees its
	// handler and its stream slot instead of holding them for a client that
	// may never read again.
	WatchSendTimeout time.Duration
}

// SetDefaults fills the zero fields with the defaults and checks the
// rest, naming the bounds when one is out of range.
func (b *Bounds) SetDefaults() error {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	def(&b.HTTPMaxConns, 4096)
	defD(&b.HTTPReadTimeout, 30*time.Second)
	defD(&b.HTTPWriteTimeout, 2*time.Minute)
	defD(&b.HTTPIdleTimeout, 60*time.Second)
	def(&b.HTTPMaxHeaderBytes, 64<<10)
	if b.GRPCMaxStreamsPerConn == 0 {
		b.GRPCMaxStreamsPerConn = 1000
	}
	def(&b.GRPCMaxConns, defaultGRPCMaxConns())
	def(&b.GRPCMaxConnsPerPeer, max(b.GRPCMaxConns/2, 1))
	defD(&b.GRPCIdleTimeout, 5*time.Minute)
	def(&b.MaxWatchStreams, 10_000)
	def(&b.MaxWatchStreamsPerClient, 1000)
	defD(&b.WatchSendTimeout, 30*time.Second)
	if b.HTTPMaxConns < 1 || b.GRPCMaxConns < 1 || b.GRPCMaxConnsPerPeer < 1 || b.GRPCIdleTimeout < 0 || b.HTTPReadTimeout < 0 || b.HTTPWriteTimeout < 0 || b.HTTPIdleTimeout < 0 || b.HTTPMaxHeaderBytes < 1 ||
		b.MaxWatchStreams < 1 || b.MaxWatchStreamsPerClient < 1 || b.WatchSendTimeout < 0 {
		return fmt.Errorf("config: bounds %+v: connection and stream limits must be ≥ 1 and timeouts ≥ 0", *b)
	}
	return nil
}

// GRPCOptions are the server's connection bounds: the stream limit per
// connection, a keepalive policy that closes connections whose client
// pings more often than every 10s (a ping flood costs the node, not the
// client) and pings idle clients to find dead connections, the idle
// timeout, the handshake deadline and the header bound.
func (b *Bounds) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(b.GRPCMaxStreamsPerConn),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second, MaxConnectionIdle: b.GRPCIdleTimeout}),
		grpc.ConnectionTimeout(10 * time.Second),
		// Headers are read before the tap handler can authenticate: bound
		// them as the HTTP port does (gRPC's default is 16 MiB a stream).
		grpc.MaxHeaderListSize(uint32(b.HTTPMaxHeaderBytes)),
	}
}

// watchMethods are the long-lived streams the stream bounds count.
var watchMethods = map[string]bool{
	"/tollgate.v1.Tracker/WatchCluster":     true,
	"/tollgate.v1.Summaries/WatchSummaries": true,
	"/tollgate.v1.Sketches/WatchSketches":   true,
}

// syncMethod is the rate-limit client stream: counted with the watch
// streams (one client's streams are bounded like its watches), its tenant
// names bounded by the service (ratelimit.ServiceConfig.MaxTenantsPerClient).
const syncMethod = "/tollgate.v1.RateLimit/Sync"

// streamLimiter counts the open watch streams, in total and per client.
type streamLimiter struct {
	total, perClient int
	open             atomic.Int64
	mu               sync.Mutex
	byClient         map[string]int
}

func newStreamLimiter(b Bounds) *streamLimiter {
	return &streamLimiter{total: b.MaxWatchStreams, perClient: b.MaxWatchStreamsPerClient, byClient: map[string]int{}}
}

// acquire takes a slot for client or says which bound refused it.
func (l *streamLimiter) acquire(client string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if int(l.open.Load()) >= l.total {
		return nil, status.Errorf(codes.ResourceExhausted, "this node serves at most %d watch streams and all are open; retry on another node or later", l.total)
	}
	if l.byClient[client] >= l.perClient {
		return nil, status.Errorf(codes.ResourceExhausted, "client %s holds %d watch streams, the most one client may hold on a node; close some (one WatchCluster stream per process is enough)", client, l.perClient)
	}
	l.byClient[client]++
	l.open.Add(1)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open.Add(-1)
		if l.byClient[client]--; l.byClient[client] <= 0 {
			delete(l.byClient, client)
		}
	}, nil
}

// StreamBounds applies the watch-stream bounds to a node's gRPC streams
// (its Intercept is a stream interceptor, after the access check, which
// names the client).
type StreamBounds struct {
	limiter       *streamLimiter
	sendTimeout   time.Duration
	refused, slow prometheus.Counter
	log           *slog.Logger
}

// NewStreamBounds bounds streams by b's MaxWatchStreams,
// MaxWatchStreamsPerClient and WatchSendTimeout, counting refused streams
// and slow readers in refused and slow.
func NewStreamBounds(b Bounds, refused, slow prometheus.Counter, log *slog.Logger) *StreamBounds {
	return &StreamBounds{limiter: newStreamLimiter(b), sendTimeout: b.WatchSendTimeout, refused: refused, slow: slow, log: log}
}

// Intercept is the stream interceptor of the stream bounds.
func (sb *StreamBounds) Intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if (!watchMethods[info.FullMethod] && info.FullMethod != syncMethod) || IsNodeCall(ss.Context()) {
		// Nodes' own streams (node credential, nodeauth.go) are not
		// clients': a flood of client streams must not shut them out.
		return h(srv, ss)
	}
	release, err := sb.limiter.acquire(ClientOf(ss.Context()))
	if err != nil {
		sb.refused.Inc()
		return err
	}
	defer release()
	if info.FullMethod == syncMethod {
		return h(srv, ss) // counted; its own sender never blocks the handler
	}
	ws := newSlowReaderStream(ss, sb.sendTimeout)
	defer ws.cancel(nil)
	err = h(srv, ws)
	if ws.slow.Load() {
		sb.slow.Inc()
		sb.log.Warn("watch stream dropped: slow reader", "method", info.FullMethod, "client", ClientOf(ss.Context()), "send_timeout", sb.sendTimeout)
		return ws.slowErr(info.FullMethod)
	}
	return err
}

// slowReaderStream bounds how long one send of a watch stream may block.
// The send runs in its own goroutine; when it has not returned within
// timeout, SendMsg answers the "slow reader" status, the stream's context
// ends (so the handler stops waiting for changes) and the handler returns.
// gRPC then ends the stream, which unblocks the pending send: the stream's
// goroutines and slot are freed, and the client, when it reads again, gets
// what was already in flight and then ResourceExhausted naming the cause.
type slowReaderStream struct {
	grpc.ServerStream
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelCauseFunc
	slow    atomic.Bool
}

var errSlowReader = errors.New("slow reader")

func newSlowReaderStream(ss grpc.ServerStream, timeout time.Duration) *slowReaderStream {
	ctx, cancel := context.WithCancelCause(ss.Context())
	return &slowReaderStream{ServerStream: ss, timeout: timeout, ctx: ctx, cancel: cancel}
}

func (w *slowReaderStream) Context() context.Context { return w.ctx }

func (w *slowReaderStream) slowErr(method string) error {
	return status.Errorf(codes.ResourceExhausted, "slow reader: %s: a message waited more than %v for this client to read it; the node closed the stream rather than buffer for it (read the stream promptly, then reconnect)", method, w.timeout)
}

func (w *slowReaderStream) SendMsg(m any) error {
	if w.slow.Load() {
		return w.slowErr("watch stream") // a send may still be pending: never start another
	}
	done := make(chan error, 1)
	go func() { done <- w.ServerStream.SendMsg(m) }()
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		w.slow.Store(true)
		w.cancel(errSlowReader)
		return w.slowErr("watch stream")
	}
}

// ConnCap is a listener that holds at most max connections. At the cap
// the connection idle longest (no request in progress) is closed to admit
// the new one, so an attacker's idle connections cannot lock out /healthz
// or a dashboard. With none idle, the connection whose request has been in
// progress longest is closed, once that request is older than
// minBusyAge: slow requests (a body trickling in, headers that never end)
// cannot lock out /healthz either, since a health check's connection lives
// milliseconds while a flood's are the oldest. Only when every connection
// is inside a request younger than minBusyAge is the new one closed at
// once (refused fast, not queued).
type ConnCap struct {
	net.Listener
	max     int
	mu      sync.Mutex
	conns   map[net.Conn]*capState
	minBusy time.Duration // minBusyAge; tests raise it under mu
	refused atomic.Uint64
	evicted atomic.Uint64
	// health: a connection the cap would refuse gets its request head
	// read, and a liveness check is answered (AnswerHealthBeyondCap).
	health   bool
	tmu      sync.Mutex
	triaging map[net.Conn]uint64 // conns whose request heads are being read → their place's number
	triageQ  []triagePlace       // the same, oldest first, and some ended
	triageN  uint64              // places taken so far (a conn's number tells its place from a later one)
	// beyondWait, places: beyondCapWait, maxBeyondCap; tests set them
	// under tmu.
	beyondWait time.Duration
	places     int
	healthAns  atomic.Uint64
	// refusals by cause (Refusals)
	refusedAt, gaveWay, noHead atomic.Uint64
}

// minBusyAge is how long a request must have been in progress before a
// new connection at the cap may displace it.
const minBusyAge = time.Second

type capState struct {
	idleSince   time.Time // zero while a request is in progress
	activeSince time.Time // when the request in progress began
	ip          string    // remote IP address (capvictim.go)
}

// NewConnCap caps l at max connections (see ConnCap); its ConnState must
// be the http.Server's ConnState hook.
func NewConnCap(l net.Listener, max int) *ConnCap {
	return &ConnCap{Listener: l, max: max, conns: map[net.Conn]*capState{}, minBusy: minBusyAge, beyondWait: beyondCapWait, places: maxBeyondCap}
}

func (c *ConnCap) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		if len(c.conns) >= c.max {
			victim := c.victimLocked() // capvictim.go
			if victim == nil {
				c.mu.Unlock()
				if c.health {
					c.triage(conn)
					continue
				}
				c.refused.Add(1)
				c.refusedAt.Add(1)
				_ = conn.Close()
				continue
			}
			delete(c.conns, victim)
			c.evicted.Add(1)
			_ = victim.Close()
		}
		c.conns[conn] = &capState{idleSince: time.Now(), ip: remoteHost(conn)}
		c.mu.Unlock()
		return conn, nil
	}
}

// AnswerHealthBeyondCap makes the cap answer liveness checks itself when
// it would refuse their connection: a connection with no other to displace
// (every request younger than minBusyAge, no idle one) gets its request
// head read, within beyondCapWait and 1 KiB, on one of at most
// maxBeyondCap goroutines; `GET /healthz` (or HEAD) is answered 200 "ok"
// as the node's handler answers it, and anything else is closed (counted
// refused). A wave of slow requests opened within a second otherwise
// refused the health checks that came during it (2 of 4 probes in that
// phase of TestPreAuthFloods at full size). Only for a plaintext
// listener: under TLS the cap sees the handshake, not the request. Call
// it before serving.
func (c *ConnCap) AnswerHealthBeyondCap() { c.health = true }

// maxBeyondCap bounds the goroutines reading refused connections' request
// heads; beyondCapWait bounds how long each may take.
const (
	maxBeyondCap  = 1024
	beyondCapWait = 250 * time.Millisecond
)

type triagePlace struct {
	conn net.Conn
	n    uint64
}

// triage starts reading conn's request head (answerHealth). With
// maxBeyondCap heads being read already, the one begun longest ago gives
// way: a liveness check sends its whole head at once and is read within
// milliseconds, so the oldest place is a flood's (silent, or trickling),
// and a flood faster than the places can be read turns over the oldest
// rather than refusing every newcomer, a health check among them. Holding
// each place for the whole wait (64 places) reset 1–4 of ~300 probes per
// full-size TestPreAuthFloods run; refusing newcomers while every place
// was younger than 10 ms still reset one of ~1,500 in a burst of slow
// requests.
func (c *ConnCap) triage(conn net.Conn) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if c.triaging == nil {
		c.triaging = map[net.Conn]uint64{}
	}
	for len(c.triaging) >= c.places && len(c.triageQ) > 0 {
		// The queue holds places in the order they were taken; those
		// already ended are skipped.
		old := c.triageQ[0]
		c.triageQ = c.triageQ[1:]
		if c.triaging[old.conn] == old.n {
			delete(c.triaging, old.conn)
			c.gaveWay.Add(1)
			_ = old.conn.Close() // its read fails: answerHealth counts it refused
		}
	}
	if len(c.triageQ) > 4*c.places { // drop the ended places' entries
		q := c.triageQ[:0:0]
		for _, e := range c.triageQ {
			if c.triaging[e.conn] == e.n {
				q = append(q, e)
			}
		}
		c.triageQ = q
	}
	c.triageN++
	n := c.triageN
	c.triaging[conn] = n
	c.triageQ = append(c.triageQ, triagePlace{conn, n})
	go c.answerHealth(conn, n, c.beyondWait)
}

// answerHealth reads conn's request head and answers a liveness check, or
// closes it.
func (c *ConnCap) answerHealth(conn net.Conn, place uint64, wait time.Duration) {
	defer func() {
		_ = conn.Close()
		c.tmu.Lock()
		if c.triaging[conn] == place {
			delete(c.triaging, conn)
		}
		c.tmu.Unlock()
	}()
	_ = conn.SetDeadline(time.Now().Add(wait))
	var buf [1024]byte
	n := 0
	for n < len(buf) && !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		m, err := conn.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	head := buf[:n]
	end := bytes.Index(head, []byte("\r\n\r\n"))
	line, _, _ := bytes.Cut(head, []byte("\r\n"))
	method, rest, _ := bytes.Cut(line, []byte(" "))
	target, proto, _ := bytes.Cut(rest, []byte(" "))
	path, _, _ := bytes.Cut(target, []byte("?"))
	if end < 0 {
		c.refused.Add(1)
		c.noHead.Add(1)
		return
	}
	if (string(method) != "GET" && string(method) != "HEAD") || string(path) != "/healthz" || !bytes.HasPrefix(proto, []byte("HTTP/1.")) {
		c.refused.Add(1)
		return
	}
	resp := "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
	if string(method) == "GET" {
		resp += "ok\n"
	}
	if _, err := io.WriteString(conn, resp); err == nil {
		c.healthAns.Add(1)
	}
}

// CapRefusals breaks Refused down: AtAccept, closed on accept (without
// AnswerHealthBeyondCap); NoHead, its head not complete within the wait
// or its place given way (GaveWay) to a newcomer; the rest sent a whole
// head that was not a liveness check.
type CapRefusals struct{ AtAccept, NoHead, GaveWay uint64 }

// Refusals is Refused by cause.
func (c *ConnCap) Refusals() CapRefusals {
	return CapRefusals{AtAccept: c.refusedAt.Load(), NoHead: c.noHead.Load(), GaveWay: c.gaveWay.Load()}
}

// HealthAnsweredBeyondCap counts the liveness checks the cap answered
// itself (AnswerHealthBeyondCap).
func (c *ConnCap) HealthAnsweredBeyondCap() uint64 { return c.healthAns.Load() }

// ConnState is the http.Server hook keeping the idle marks (the
// connection the server sees may be a *tls.Conn over ours).
func (c *ConnCap) ConnState(conn net.Conn, st http.ConnState) {
	raw := underlying(conn)
	c.mu.Lock()
	defer c.mu.Unlock()
	cs, ok := c.conns[raw]
	switch st {
	case http.StateActive:
		if ok {
			cs.idleSince, cs.activeSince = time.Time{}, time.Now()
		}
	case http.StateIdle:
		if ok {
			cs.idleSince = time.Now()
		}
	case http.StateClosed, http.StateHijacked:
		delete(c.conns, raw)
	}
}

// Open is the number of connections the cap holds.
func (c *ConnCap) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Collectors are the cap's metrics: open connections, and those refused
// and evicted at the cap.
func (c *ConnCap) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_http_connections",
			Help: "Open HTTP connections (at most the connection cap)."}, func() float64 { return float64(c.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_http_connections_refused_total",
			Help: "HTTP connections closed on accept because the cap was reached and none was idle."}, func() float64 { return float64(c.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_http_connections_evicted_total",
			Help: "Idle HTTP connections closed to admit a new one at the cap."}, func() float64 { return float64(c.Evicted()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_http_health_answered_at_cap_total",
			Help: "Liveness checks (GET /healthz) answered by the connection cap itself on connections it could not admit."}, func() float64 { return float64(c.HealthAnsweredBeyondCap()) }),
	}
}

// underlying returns the accepted connection under a TLS one.
func underlying(c net.Conn) net.Conn {
	if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		return u.NetConn()
	}
	return c
}

// Refused counts the connections closed on accept at a cap.
func (c *ConnCap) Refused() uint64 { return c.refused.Load() }

// Evicted counts the connections closed to admit a new one at a cap.
func (c *ConnCap) Evicted() uint64 { return c.evicted.Load() }

// Open is the number of watch streams open on the node.
func (sb *StreamBounds) Open() int64 { return sb.limiter.open.Load() }
