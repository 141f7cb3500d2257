package access

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// defaultGRPCMaxConns is the gRPC connection cap when none is configured:
// a quarter of the process's file descriptor limit, at most 10,000, so
// connections to the client port can never take the descriptors raft,
// gossip, the HTTP port (health checks) and the data files need.
func defaultGRPCMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return int(min(max(rl.Cur/4, 64), 10_000))
}

// GRPCCap is the gRPC listener's connection bound: at most max connections,
// and at most perPeer from one IP address. At a bound the connection with
// no call in progress that has been quiet longest is closed to admit the
// new one, one that never carried a call first (an idle HTTP/2 connection
// costs a descriptor and a reader, and a flood of them once filled the
// node's descriptors until health checks failed); with every connection in
// a call, the new one is closed at once. The server's stats handler
// (GRPCCap.StatsHandler) tells it which connections are in a call.
type GRPCCap struct {
	net.Listener
	max, perPeer int
	mu           sync.Mutex
	conns        map[string]*capConn // by remote address
	byIP         map[string]int
	refused      atomic.Uint64
	evicted      atomic.Uint64
}

type capConn struct {
	net.Conn
	c       *GRPCCap
	key, ip string
	calls   int       // in progress
	used    bool      // carried a call
	quiet   time.Time // since when no call is in progress
	once    sync.Once
}

func (c *capConn) Close() error {
	c.once.Do(func() { c.c.forget(c) })
	return c.Conn.Close()
}

// NewGRPCCap bounds l at max connections, perPeer from one IP address.
func NewGRPCCap(l net.Listener, max, perPeer int) *GRPCCap {
	return &GRPCCap{Listener: l, max: max, perPeer: perPeer, conns: map[string]*capConn{}, byIP: map[string]int{}}
}

func (g *GRPCCap) forget(c *capConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns[c.key] == c {
		delete(g.conns, c.key)
		if g.byIP[c.ip]--; g.byIP[c.ip] <= 0 {
			delete(g.byIP, c.ip)
		}
	}
}

// victim picks the connection to close at a bound (g.mu held): among
// those of ip ("" any), with no call in progress, never used first, then
// quiet longest; nil when every one is in a call.
func (g *GRPCCap) victim(ip string) *capConn {
	var v *capConn
	for _, c := range g.conns {
		if c.calls > 0 || (ip != "" && c.ip != ip) {
			continue
		}
		if v == nil || (!c.used && v.used) || (c.used == v.used && c.quiet.Before(v.quiet)) {
			v = c
		}
	}
	return v
}

func (g *GRPCCap) Accept() (net.Conn, error) {
	for {
		conn, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := conn.RemoteAddr().String()
		if tcp, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
			ip = tcp.IP.String()
		}
		g.mu.Lock()
		var drop []*capConn
		ok := true
		if g.byIP[ip] >= g.perPeer {
			if v := g.victim(ip); v != nil {
				drop = append(drop, v)
				g.dropLocked(v)
			} else {
				ok = false
			}
		}
		if ok && len(g.conns) >= g.max {
			if v := g.victim(""); v != nil {
				drop = append(drop, v)
				g.dropLocked(v)
			} else {
				ok = false
			}
		}
		if !ok {
			g.mu.Unlock()
			g.refused.Add(1)
			_ = conn.Close()
			continue
		}
		c := &capConn{Conn: conn, c: g, key: conn.RemoteAddr().String(), ip: ip, quiet: time.Now()}
		g.conns[c.key] = c
		g.byIP[ip]++
		g.mu.Unlock()
		for _, v := range drop {
			g.evicted.Add(1)
			_ = v.Conn.Close() // gRPC's reader sees the close and ends the transport
		}
		return c, nil
	}
}

// dropLocked removes v from the books (g.mu held).
func (g *GRPCCap) dropLocked(v *capConn) {
	delete(g.conns, v.key)
	if g.byIP[v.ip]--; g.byIP[v.ip] <= 0 {
		delete(g.byIP, v.ip)
	}
}

// Open is the number of connections the cap holds.
func (g *GRPCCap) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// StatsHandler is the gRPC stats handler that marks connections busy
// while a call is in progress (grpc.StatsHandler).
func (g *GRPCCap) StatsHandler() stats.Handler { return capStats{g} }

type capStats struct{ g *GRPCCap }

type capConnKey struct{}

func (h capStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, capConnKey{}, info.RemoteAddr.String())
}

func (h capStats) HandleConn(context.Context, stats.ConnStats) {}

func (h capStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (h capStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	if st.IsClient() {
		return
	}
	var delta int
	switch st.(type) {
	case *stats.Begin:
		delta = 1
	case *stats.End:
		delta = -1
	default:
		return
	}
	key, _ := ctx.Value(capConnKey{}).(string)
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	c := h.g.conns[key]
	if c == nil {
		return
	}
	c.calls += delta
	c.used = true
	if c.calls <= 0 {
		c.calls = 0
		c.quiet = time.Now()
	}
}

// Collectors are the cap's metrics: open connections, and those refused
// and evicted at a cap.
func (g *GRPCCap) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tollgate_grpc_connections",
			Help: "Open gRPC connections (at most the connection cap)."}, func() float64 { return float64(g.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_grpc_connections_refused_total",
			Help: "gRPC connections closed on accept because a cap was reached and every connection was in a call."}, func() float64 { return float64(g.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tollgate_grpc_connections_evicted_total",
			Help: "Quiet gRPC connections closed to admit a new one at a cap."}, func() float64 { return float64(g.Evicted()) }),
	}
}

// Refused counts the connections closed on accept at a cap.
func (g *GRPCCap) Refused() uint64 { return g.refused.Load() }

// Evicted counts the connections closed to admit a new one at a cap.
func (g *GRPCCap) Evicted() uint64 { return g.evicted.Load() }
