package membership

import (
	"log"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// DefaultMaxStreams is the default of Config.MaxStreams.
const DefaultMaxStreams = 128

// streamTimeout bounds an inbound gossip stream from accept to close: the
// same as memberlist's own TCPTimeout for LAN configs (10s), which it sets
// once per stream, but counted from the accept and enforced here, so that a
// stream's slot always comes back.
const streamTimeout = 10 * time.Second

// cappedTransport is memberlist's NetTransport (UDP packets, TCP streams)
// with its inbound TCP streams capped. memberlist starts a goroutine with a
// 4 KiB reader for every accepted stream (push-pull state sync, TCP
// probes, user messages) and holds it until the peer speaks or TCPTimeout
// passes: 50,000 idle connections to the gossip port were 50,000 of each.
// Here at most max streams are open at once, perIP of them from one IP
// address; a connection beyond is closed as it comes out of the listener,
// before memberlist sees it, and counted. Peers open a stream now and then
// (push-pull every 30s) and retry a failed one on the next round, and
// failure detection runs on UDP, so a refused stream costs a peer nothing
// but a delay.
type cappedTransport struct {
	*memberlist.NetTransport
	max, perIP int
	timeout    time.Duration
	log        *slog.Logger

	out      chan net.Conn
	stopping chan struct{} // Shutdown started: close what comes in
	done     chan struct{} // the inner transport is down: relay returns
	wg       sync.WaitGroup
	shutOnce sync.Once

	mu       sync.Mutex
	open     int
	byIP     map[string]int
	lastWarn time.Time
	refused  atomic.Uint64
}

var _ memberlist.NodeAwareTransport = (*cappedTransport)(nil)

func newCappedTransport(bindHost string, bindPort, maxStreams int, logger *log.Logger, slogger *slog.Logger) (*cappedTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{bindHost},
		BindPort:  bindPort,
		Logger:    logger,
	})
	if err != nil {
		return nil, err
	}
	t := &cappedTransport{
		NetTransport: nt,
		max:          maxStreams,
		perIP:        max(maxStreams/4, 1),
		timeout:      streamTimeout,
		log:          slogger,
		out:          make(chan net.Conn),
		stopping:     make(chan struct{}),
		done:         make(chan struct{}),
		byIP:         map[string]int{},
	}
	t.wg.Add(1)
	go t.relay()
	return t, nil
}

// StreamCh is where memberlist takes the admitted streams from.
func (t *cappedTransport) StreamCh() <-chan net.Conn { return t.out }

// Shutdown stops the inner transport (the relay keeps taking its streams
// meanwhile, closing them, so its accept loop is never stuck), then the
// relay.
func (t *cappedTransport) Shutdown() error {
	var err error
	t.shutOnce.Do(func() {
		close(t.stopping)
		err = t.NetTransport.Shutdown()
		close(t.done)
		t.wg.Wait()
	})
	return err
}

func (t *cappedTransport) relay() {
	defer t.wg.Done()
	in := t.NetTransport.StreamCh()
	for {
		select {
		case c := <-in:
			sc := t.admit(c)
			if sc == nil {
				continue
			}
			select {
			case t.out <- sc:
			case <-t.stopping:
				_ = sc.Close()
			}
		case <-t.done:
			return
		}
	}
}

// admit books c, or closes it at a cap (or during shutdown) and returns nil.
func (t *cappedTransport) admit(c net.Conn) *streamConn {
	select {
	case <-t.stopping:
		_ = c.Close()
		return nil
	default:
	}
	ip := c.RemoteAddr().String()
	if tcp, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip = tcp.IP.String()
	}
	t.mu.Lock()
	if t.open >= t.max || t.byIP[ip] >= t.perIP {
		open, fromIP := t.open, t.byIP[ip]
		warn := time.Since(t.lastWarn) >= 30*time.Second
		if warn {
			t.lastWarn = time.Now()
		}
		// Counted before the close, so that whoever sees the close
		// also sees the count.
		n := t.refused.Add(1)
		t.mu.Unlock()
		_ = c.Close()
		if warn {
			t.log.Warn("membership: too many gossip streams open; closing new ones at once (gossip over UDP is not affected)",
				"open", open, "open_from_remote", fromIP, "remote", ip, "max", t.max, "max_per_host", t.perIP, "refused_total", n)
		}
		return nil
	}
	t.open++
	t.byIP[ip]++
	t.mu.Unlock()
	sc := &streamConn{Conn: c, t: t, ip: ip, limit: time.Now().Add(t.timeout)}
	_ = c.SetDeadline(sc.limit)
	return sc
}

func (t *cappedTransport) release(ip string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.open--
	if t.byIP[ip]--; t.byIP[ip] <= 0 {
		delete(t.byIP, ip)
	}
}

// StreamStats are the gossip port's stream counts, for metrics.
type StreamStats struct {
	// Open is the number of inbound gossip streams open (at most
	// Config.MaxStreams).
	Open int
	// Refused counts inbound streams closed on accept at a cap.
	Refused uint64
}

func (t *cappedTransport) stats() StreamStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return StreamStats{Open: t.open, Refused: t.refused.Load()}
}

// streamConn is an admitted stream: it frees its slot when closed, and no
// deadline set on it reaches past its limit.
type streamConn struct {
	net.Conn
	t     *cappedTransport
	ip    string
	limit time.Time
	once  sync.Once
}

func (c *streamConn) Close() error {
	c.once.Do(func() { c.t.release(c.ip) })
	return c.Conn.Close()
}

func (c *streamConn) clamp(d time.Time) time.Time {
	if d.IsZero() || d.After(c.limit) {
		return c.limit
	}
	return d
}

func (c *streamConn) SetDeadline(d time.Time) error { return c.Conn.SetDeadline(c.clamp(d)) }

func (c *streamConn) SetReadDeadline(d time.Time) error {
	return c.Conn.SetReadDeadline(c.clamp(d))
}

func (c *streamConn) SetWriteDeadline(d time.Time) error {
	return c.Conn.SetWriteDeadline(c.clamp(d))
}
