package raftnode

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// Connection header written by the dialing side right after the TCP connect
// (and after the TLS handshake when TLS is enabled), before any raft bytes:
//
//	offset 0: 4 bytes  magic "TGRF"
//	offset 4: 1 byte   header version (currently 1)
//	offset 5: 2 bytes  group id, big-endian uint16
//
// Version 2 (sent when the dialed address names an incarnation, identity.go)
// continues with:
//
//	offset 7:  8 bytes  the dialer's cluster id (zero: not known yet)
//	offset 15: 8 bytes  the incarnation the dialed address names
//
// Version 3 (sent by every node of a cluster with a key, MuxConfig.ClusterKeys)
// continues version 2's fields with:
//
//	offset 23: 8 bytes  the dialer's clock, unix milliseconds, big-endian
//	offset 31: 16 bytes a random nonce
//	offset 47: 32 bytes HMAC-SHA256 under the cluster key of bytes 0..46
//
// A listener with a key accepts nothing else, and checks the MAC before it
// looks at the cluster id or incarnation: bytes from a stranger are dropped
// quietly and never count as a refused incarnation (which readiness and
// status report to the operator), and a stranger who knows a node's
// incarnation still cannot ask it for a vote. A header is good for
// HeaderWindow and once (the listener remembers the nonces it accepted).
//
// Everything after the header belongs to hashicorp/raft's NetworkTransport
// of that group. The listener never answers the header: a rejected
// connection is simply closed, which the dialer's raft transport sees as an
// I/O error on its first RPC (and retries like any other failure).
const (
	headerMagic   = "TGRF"
	headerVersion = 1
	headerLen     = 7
	// headerV2 adds the cluster id and incarnation (identity.go).
	headerV2    = 2
	headerV2Len = headerLen + IDLen

	// headerV3 adds the time, nonce and MAC (MuxConfig.ClusterKeys).
	headerV3    = 3
	headerV3Len = headerV2Len + 8 + 16 + 32

	// HeaderWindow is how far an authenticated header's time may be from
	// the listener's clock.
	HeaderWindow = 2 * time.Minute

	// MaxGroups is the number of group ids the header can address.
	MaxGroups = 1 << 16

	// DefaultHandshakeTimeout bounds how long an accepted connection may take
	// to complete TLS (if enabled) and send its header.
	DefaultHandshakeTimeout = 5 * time.Second

	// DefaultMaxPendingConns is how many accepted connections may be in
	// their handshake (TLS, header) at once; DefaultMaxPendingConns/4 of
	// them from one IP address (MuxConfig.MaxPendingConnsPerHost).
	DefaultMaxPendingConns = 256
)

// ErrUnknownGroup is returned when dialing or registering an invalid group id.
var ErrUnknownGroup = errors.New("raftnode: unknown group")

func encodeHeader(group int) [headerLen]byte {
	var h [headerLen]byte
	copy(h[:4], headerMagic)
	h[4] = headerVersion
	binary.BigEndian.PutUint16(h[5:], uint16(group))
	return h
}

// decodeHeader validates a header and returns its group id.
func decodeHeader(h [headerLen]byte) (int, error) {
	if string(h[:4]) != headerMagic {
		return 0, fmt.Errorf("bad magic %q", h[:4])
	}
	if h[4] != headerVersion && h[4] != headerV2 && h[4] != headerV3 {
		return 0, fmt.Errorf("unsupported header version %d", h[4])
	}
	return int(binary.BigEndian.Uint16(h[5:])), nil
}

// MuxConfig configures a Mux.
type MuxConfig struct {
	// AdvertiseAddr is the address other nodes dial to reach this listener
	// ("host:port"); it is what Addr() and every GroupLayer.Addr() report,
	// and so what raft advertises as this node's address. Empty means the
	// listener's own address.
	AdvertiseAddr string

	// ServerTLS, if set, makes the listener run a TLS server handshake on
	// every accepted connection before reading the header. Set
	// ClientAuth = tls.RequireAndVerifyClientCert for mutual TLS.
	ServerTLS *tls.Config
	// ClientTLS, if set, makes Dial run a TLS client handshake before writing
	// the header. If its ServerName is empty, the host part of the dialed
	// address is used. Nodes of one cluster must agree: either all use TLS
	// on the raft port or none does.
	ClientTLS *tls.Config

	// HandshakeTimeout bounds TLS handshake + header read on accepted
	// connections, so a silent client cannot hold a goroutine forever.
	// Default DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	// Identity binds accepted connections to this node's incarnation and
	// cluster (identity.go); the zero value accepts every connection.
	// AdvertiseAddr should then name the incarnation (WithIncarnation).
	Identity Identity

	// ClusterKeys, when set, authenticate the connection header (version
	// 3): ClusterKeys[0] signs, every key verifies, and a connection
	// without a valid MAC is closed before its header is looked at further.
	ClusterKeys [][]byte

	// MaxPendingConns caps the accepted connections still in their
	// handshake (TLS and header not yet complete and verified), and
	// MaxPendingConnsPerHost those of one IP address. A connection beyond
	// either cap is closed as soon as it is accepted, before anything is
	// read or a goroutine started for it, and counted (Stats.Refused): a
	// flood of idle connections to the raft port then costs the node
	// nothing but the accept, and a flood from one address leaves slots
	// for the peers. Connections that completed their handshake are not
	// counted: a peer's established raft connections are never refused.
	// Defaults DefaultMaxPendingConns and a quarter of MaxPendingConns.
	MaxPendingConns        int
	MaxPendingConnsPerHost int

	Logger *slog.Logger // default slog.Default()
}

// Mux shares one TCP listener among several raft groups. Each group gets a
// GroupLayer (a raft.StreamLayer) from Register. Incoming connections are
// routed by their header; outgoing connections are dialed by the group's
// layer, which writes the header.
//
// Connections are accepted only once Start has been called, so that every
// group can be registered first (a connection for a not-yet-registered group
// would otherwise be rejected).
type Mux struct {
	ln        net.Listener
	addr      net.Addr
	serverTLS *tls.Config
	clientTLS *tls.Config
	hsTimeout time.Duration
	log       *slog.Logger
	ident     identityState
	keys      [][]byte
	maxPend   int // MuxConfig.MaxPendingConns
	maxPendIP int // MuxConfig.MaxPendingConnsPerHost
	refused   atomic.Uint64
	lastWarn  time.Time // accept loop only: last "pending cap reached" warning
	seenMu    sync.Mutex
	seen      map[[16]byte]int64 // accepted header nonces → expiry (unix ms)

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu       sync.Mutex
	layers   map[int]*GroupLayer
	pending  map[net.Conn]string // accepted, header not yet read → remote IP
	pendIP   map[string]int      // pending connections by remote IP
	started  bool
	closed   bool
	closeErr error

	wg sync.WaitGroup // accept loop + handshake goroutines
}

// NewMux wraps ln. The Mux owns ln from now on: Close closes it.
func NewMux(ln net.Listener, cfg MuxConfig) (*Mux, error) {
	if ln == nil {
		return nil, errors.New("raftnode: NewMux: nil listener")
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxPendingConns < 0 || cfg.MaxPendingConnsPerHost < 0 {
		return nil, fmt.Errorf("raftnode: NewMux: MaxPendingConns %d and MaxPendingConnsPerHost %d must be ≥ 0 (0: default)", cfg.MaxPendingConns, cfg.MaxPendingConnsPerHost)
	}
	if cfg.MaxPendingConns == 0 {
		cfg.MaxPendingConns = DefaultMaxPendingConns
	}
	if cfg.MaxPendingConnsPerHost == 0 {
		cfg.MaxPendingConnsPerHost = max(cfg.MaxPendingConns/4, 1)
	}
	var addr net.Addr = ln.Addr()
	if cfg.AdvertiseAddr != "" {
		endpoint, _ := SplitIncarnation(cfg.AdvertiseAddr)
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			return nil, fmt.Errorf("raftnode: bad advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
		addr = advertiseAddr(cfg.AdvertiseAddr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Mux{
		ln:        ln,
		addr:      addr,
		serverTLS: cfg.ServerTLS,
		clientTLS: cfg.ClientTLS,
		hsTimeout: cfg.HandshakeTimeout,
		log:       cfg.Logger,
		ctx:       ctx,
		cancel:    cancel,
		layers:    make(map[int]*GroupLayer),
		pending:   make(map[net.Conn]string),
		pendIP:    make(map[string]int),
		maxPend:   cfg.MaxPendingConns,
		maxPendIP: cfg.MaxPendingConnsPerHost,
		ident:     identityState{id: cfg.Identity},
		keys:      cfg.ClusterKeys,
		seen:      map[[16]byte]int64{},
	}, nil
}

// advertiseAddr is a net.Addr whose String is a configured "host:port",
// which may be a DNS name.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// Addr returns the advertised address.
func (m *Mux) Addr() net.Addr { return m.addr }

// ListenAddr returns the address the listener is actually bound to.
func (m *Mux) ListenAddr() net.Addr { return m.ln.Addr() }

// Register creates the stream layer of a group. It fails if the group id is
// out of range, if the group already has an open layer, or if the Mux is
// closed. After the layer is closed the id may be registered again.
func (m *Mux) Register(group int) (*GroupLayer, error) {
	if group < 0 || group >= MaxGroups {
		return nil, fmt.Errorf("%w: %d out of range [0, %d)", ErrUnknownGroup, group, MaxGroups)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("raftnode: register group %d: %w", group, net.ErrClosed)
	}
	if _, ok := m.layers[group]; ok {
		return nil, fmt.Errorf("raftnode: group %d already registered", group)
	}
	l := &GroupLayer{
		mux:    m,
		group:  group,
		header: encodeHeader(group),
		accept: make(chan net.Conn),
		done:   make(chan struct{}),
		conns:  make(map[*trackedConn]struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(m.ctx)
	m.layers[group] = l
	return l, nil
}

// Start begins accepting connections. Calling it again is a no-op.
func (m *Mux) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.closed {
		return
	}
	m.started = true
	m.wg.Add(1)
	go m.acceptLoop()
}

// Close closes the listener, every group layer (their Accept calls return an
// error wrapping net.ErrClosed) and every connection the Mux accepted or
// dialed, then waits for its goroutines. Idempotent.
func (m *Mux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return m.closeErr
	}
	m.closed = true
	m.cancel()
	err := m.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	m.closeErr = err
	layers := make([]*GroupLayer, 0, len(m.layers))
	for _, l := range m.layers {
		layers = append(layers, l)
	}
	for c := range m.pending {
		_ = c.Close()
	}
	m.mu.Unlock()

	for _, l := range layers {
		_ = l.Close()
	}
	m.wg.Wait()
	return err
}

func (m *Mux) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

func (m *Mux) acceptLoop() {
	defer m.wg.Done()
	const baseDelay, maxDelay = 5 * time.Millisecond, time.Second
	var delay time.Duration
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			if m.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. EMFILE): back off like net/http does.
			if delay == 0 {
				delay = baseDelay
			} else {
				delay = min(2*delay, maxDelay)
			}
			m.log.Warn("raft mux: accept failed", "error", err, "retry_in", delay)
			select {
			case <-time.After(delay):
				continue
			case <-m.ctx.Done():
				return
			}
		}
		delay = 0

		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			_ = conn.Close()
			return
		}
		ip := remoteIP(conn)
		if len(m.pending) >= m.maxPend || m.pendIP[ip] >= m.maxPendIP {
			// At a cap: close before reading a byte or starting a
			// goroutine. The slots come back within the handshake
			// timeout, since every pending connection has one.
			total, fromIP := len(m.pending), m.pendIP[ip]
			m.mu.Unlock()
			_ = conn.Close()
			n := m.refused.Add(1)
			if now := time.Now(); now.Sub(m.lastWarn) >= 30*time.Second {
				m.lastWarn = now
				m.log.Warn("raft mux: too many connections in their handshake; closing new ones at once (established raft connections are not affected)",
					"pending", total, "pending_from_remote", fromIP, "remote", ip,
					"max_pending", m.maxPend, "max_pending_per_host", m.maxPendIP, "refused_total", n)
			}
			continue
		}
		m.pending[conn] = ip
		m.pendIP[ip]++
		m.wg.Add(1)
		m.mu.Unlock()
		go m.handshake(conn)
	}
}

// remoteIP is the IP address of conn's remote end (its whole address if
// it is not TCP).
func remoteIP(conn net.Conn) string {
	if tcp, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return conn.RemoteAddr().String()
}

// MuxStats are the Mux's connection counts, for metrics.
type MuxStats struct {
	// Pending is the number of accepted connections in their handshake.
	Pending int
	// Refused counts connections closed on accept because a pending cap
	// (MuxConfig.MaxPendingConns, MaxPendingConnsPerHost) was reached.
	Refused uint64
}

// Stats reports the Mux's connection counts.
func (m *Mux) Stats() MuxStats {
	m.mu.Lock()
	n := len(m.pending)
	m.mu.Unlock()
	return MuxStats{Pending: n, Refused: m.refused.Load()}
}

// handshake runs on its own goroutine per accepted connection: it performs
// the TLS handshake (if enabled) and reads the header under a deadline, then
// hands the connection to its group's layer.
func (m *Mux) handshake(raw net.Conn) {
	defer m.wg.Done()
	var once sync.Once
	removePending := func() {
		once.Do(func() {
			m.mu.Lock()
			if ip, ok := m.pending[raw]; ok {
				delete(m.pending, raw)
				if m.pendIP[ip]--; m.pendIP[ip] <= 0 {
					delete(m.pendIP, ip)
				}
			}
			m.mu.Unlock()
		})
	}
	reject := func(level slog.Level, reason string, args ...any) {
		removePending()
		_ = raw.Close()
		if m.isClosed() {
			return
		}
		m.log.Log(context.Background(), level, "raft mux: rejected connection",
			append([]any{"remote", raw.RemoteAddr().String(), "reason", reason}, args...)...)
	}

	_ = raw.SetDeadline(time.Now().Add(m.hsTimeout))
	var conn net.Conn = raw
	if m.serverTLS != nil {
		tc := tls.Server(raw, m.serverTLS)
		if err := tc.HandshakeContext(m.ctx); err != nil {
			reject(slog.LevelWarn, "tls handshake failed", "error", err)
			return
		}
		conn = tc
	}
	var h [headerLen]byte
	if _, err := io.ReadFull(conn, h[:]); err != nil {
		// Connect-and-close probes (load balancer health checks, port
		// scans) end up here; keep them out of the warning log.
		reject(slog.LevelDebug, "no header", "error", err)
		return
	}
	group, err := decodeHeader(h)
	if err != nil {
		reject(slog.LevelWarn, "bad header", "error", err)
		return
	}
	if len(m.keys) > 0 && h[4] != headerV3 {
		// Debug only: a stranger's bytes must not fill the warning log.
		reject(slog.LevelDebug, "unauthenticated header (this cluster has a key: nodes send version 3)", "version", h[4])
		return
	}
	var named, cluster string
	if h[4] == headerV2 || h[4] == headerV3 {
		var ext [IDLen]byte
		if _, err := io.ReadFull(conn, ext[:]); err != nil {
			reject(slog.LevelWarn, "short header", "error", err)
			return
		}
		cluster, named = idString(ext[:IDLen/2]), idString(ext[IDLen/2:])
		if h[4] == headerV3 {
			var auth [headerV3Len - headerV2Len]byte
			if _, err := io.ReadFull(conn, auth[:]); err != nil {
				reject(slog.LevelDebug, "short header", "error", err)
				return
			}
			if why := m.checkHeaderMAC(append(append(h[:], ext[:]...), auth[:]...)); why != "" {
				reject(slog.LevelDebug, why, "group", group)
				return
			}
		}
	}
	if why := m.ident.check(group, named, cluster); why != "" {
		lvl := slog.LevelDebug
		if m.ident.shouldLog(fmt.Sprint(group, named, cluster)) {
			lvl = slog.LevelWarn
		}
		reject(lvl, why, "group", group)
		return
	}
	_ = raw.SetDeadline(time.Time{})

	m.mu.Lock()
	l := m.layers[group]
	m.mu.Unlock()
	if l == nil {
		reject(slog.LevelWarn, "unknown group", "group", group)
		return
	}
	removePending()
	l.deliver(conn)
}

// headerMAC is the MAC of an authenticated header's first 47 bytes.
func headerMAC(key, b []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(b)
	return h.Sum(nil)
}

// checkHeaderMAC verifies a version 3 header (hdr: all headerV3Len bytes)
// and records its nonce; it returns why it is refused, "" when accepted.
func (m *Mux) checkHeaderMAC(hdr []byte) string {
	signed, got := hdr[:headerV3Len-32], hdr[headerV3Len-32:]
	ok := false
	for _, k := range m.keys {
		if hmac.Equal(got, headerMAC(k, signed)) {
			ok = true
		}
	}
	if !ok {
		return "header MAC does not verify under the cluster key (not a node of this cluster)"
	}
	ts := int64(binary.BigEndian.Uint64(signed[headerV2Len:]))
	now := time.Now().UnixMilli()
	if d := now - ts; d > HeaderWindow.Milliseconds() || d < -HeaderWindow.Milliseconds() {
		return fmt.Sprintf("header time is %v from this node's clock (at most %v)", time.Duration(d)*time.Millisecond, HeaderWindow)
	}
	var n [16]byte
	copy(n[:], signed[headerV2Len+8:])
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if _, dup := m.seen[n]; dup {
		return "header replayed"
	}
	if len(m.seen) > 1<<16 {
		for k, exp := range m.seen {
			if exp < now {
				delete(m.seen, k)
			}
		}
	}
	m.seen[n] = ts + 2*HeaderWindow.Milliseconds()
	return ""
}

// GroupLayer is one group's raft.StreamLayer on a shared Mux. Accept returns
// the connections whose header names this group; Dial opens connections to
// the same group on another node. Close stops this group only: the shared
// listener and the other groups are unaffected.
type GroupLayer struct {
	mux    *Mux
	group  int
	header [headerLen]byte
	accept chan net.Conn
	ctx    context.Context // cancelled by Close (or the Mux's Close)
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	conns  map[*trackedConn]struct{} // accepted and dialed, still open
	// peerClosed, if set, is called (on its own goroutine) when a peer
	// ends a connection this layer accepted: a read met EOF or a reset
	// while the layer is open (leaderdown.go).
	peerClosed func()
}

// onPeerClosed sets the layer's peerClosed hook; connections accepted
// before it is set do not call it.
func (l *GroupLayer) onPeerClosed(fn func()) {
	l.mu.Lock()
	l.peerClosed = fn
	l.mu.Unlock()
}

var _ raft.StreamLayer = (*GroupLayer)(nil)

// Group returns the group id of the layer.
func (l *GroupLayer) Group() int { return l.group }

// Addr returns the Mux's advertised address (raft uses it as this node's
// address for the group).
func (l *GroupLayer) Addr() net.Addr { return l.mux.addr }

// Accept waits for the next connection for this group. After Close (of the
// layer or of the Mux) it returns an error wrapping net.ErrClosed.
func (l *GroupLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("raftnode: group %d stream layer: %w", l.group, net.ErrClosed)
	}
}

// Close unregisters the group from the Mux, unblocks Accept and closes
// every connection this layer accepted or dialed. Idempotent.
func (l *GroupLayer) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.cancel()
	close(l.done)
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()

	for _, c := range conns {
		_ = c.Close()
	}
	m := l.mux
	m.mu.Lock()
	if m.layers[l.group] == l {
		delete(m.layers, l.group)
	}
	m.mu.Unlock()
	return nil
}

// Dial connects to the same group on the node at address: TCP connect, TLS
// handshake if the Mux has a ClientTLS config, then the header. timeout
// bounds the whole sequence (zero means the Mux's handshake timeout).
func (l *GroupLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = l.mux.hsTimeout
	}
	ctx, cancel := context.WithTimeout(l.ctx, timeout)
	defer cancel()

	endpoint, inc := SplitIncarnation(string(address))
	if inc != "" {
		if err := ValidID(inc); err != nil {
			return nil, fmt.Errorf("raftnode: dial group %d at %s: bad incarnation: %w", l.group, address, err)
		}
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (net.Conn, error) {
		_ = raw.Close()
		return nil, fmt.Errorf("raftnode: dial group %d at %s: %w", l.group, address, err)
	}
	deadline, _ := ctx.Deadline()
	_ = raw.SetDeadline(deadline)

	var conn net.Conn = raw
	if l.mux.clientTLS != nil {
		cfg := l.mux.clientTLS
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(endpoint)
			if err != nil {
				return fail(err)
			}
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("tls handshake: %w", err))
		}
		conn = tc
	}
	hdr := l.header[:]
	if keys := l.mux.keys; len(keys) > 0 {
		// Authenticated header (version 3), always with the v2 fields.
		ext := make([]byte, 0, headerV3Len)
		ext = append(ext, l.header[:]...)
		ext[4] = headerV3
		cid, want := idBytes(l.mux.ident.get().ClusterID), idBytes(inc)
		ext = append(append(ext, cid[:]...), want[:]...)
		ext = binary.BigEndian.AppendUint64(ext, uint64(time.Now().UnixMilli()))
		var n [16]byte
		_, _ = rand.Read(n[:])
		ext = append(ext, n[:]...)
		hdr = append(ext, headerMAC(keys[0], ext)...)
	} else if inc != "" {
		// The address names an incarnation: only a build that understands
		// version 2 wrote it, so the peer reads the longer header.
		ext := make([]byte, 0, headerV2Len)
		ext = append(ext, l.header[:]...)
		ext[4] = headerV2
		cid, want := idBytes(l.mux.ident.get().ClusterID), idBytes(inc)
		hdr = append(append(ext, cid[:]...), want[:]...)
	}
	if _, err := conn.Write(hdr); err != nil {
		return fail(fmt.Errorf("write header: %w", err))
	}
	_ = raw.SetDeadline(time.Time{})

	tc := l.track(conn, false)
	if tc == nil {
		_ = conn.Close()
		return nil, fmt.Errorf("raftnode: dial group %d: %w", l.group, net.ErrClosed)
	}
	return tc, nil
}

// deliver hands an accepted connection (header already consumed) to Accept.
func (l *GroupLayer) deliver(conn net.Conn) {
	tc := l.track(conn, true)
	if tc == nil {
		_ = conn.Close()
		return
	}
	select {
	case l.accept <- tc:
	case <-l.done:
		_ = tc.Close()
	}
}

// track registers conn with the layer so Close can close it; nil if the
// layer is already closed. accepted: the peer dialed it (deliver).
func (l *GroupLayer) track(conn net.Conn, accepted bool) *trackedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	tc := &trackedConn{Conn: conn, layer: l}
	if accepted {
		tc.peerClosed = l.peerClosed
	}
	l.conns[tc] = struct{}{}
	return tc
}

// trackedConn removes itself from its layer's set when closed.
type trackedConn struct {
	net.Conn
	layer *GroupLayer
	once  sync.Once
	// peerClosed: the layer's hook, for accepted connections; called once,
	// when a read finds the peer's end closed.
	peerClosed func()
	ended      sync.Once
}

// Read passes reads through; a read that finds the connection ended by the
// peer (EOF or reset, not a timeout, and not this node closing it) calls the
// layer's peerClosed hook once.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.peerClosed != nil && peerEnded(err) {
		c.ended.Do(func() {
			c.layer.mu.Lock()
			closed := c.layer.closed
			c.layer.mu.Unlock()
			if !closed {
				go c.peerClosed()
			}
		})
	}
	return n, err
}

// peerEnded reports whether a read error means the remote end closed or
// reset the connection (as a peer process that exits does).
func peerEnded(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.layer.mu.Lock()
		delete(c.layer.conns, c)
		c.layer.mu.Unlock()
	})
	return err
}
