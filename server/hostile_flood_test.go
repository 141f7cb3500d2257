package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/raftnode"
)

// The attackers below run in a child process (TestMain's TOLLGATE_FLOOD),
// so their sockets and buffers are not counted in the node's process.

// floodGRPCIncomplete opens n gRPC streams without a credential over
// conns of at most 100 streams each, and on each sends a message's length
// prefix announcing msgLen bytes and then msgLen-1 bytes as fast as HTTP/2
// flow control lets it: a message that never completes. A node that reads
// messages before authenticating holds a buffer of msgLen per stream.
func floodGRPCIncomplete(addr string, n, msgLen int) int {
	const perConn = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	opened := 0
	for c := 0; c*perConn < n; c++ {
		wg.Add(1)
		go func(streams int) {
			defer wg.Done()
			k := incompleteConn(addr, streams, msgLen)
			mu.Lock()
			opened += k
			mu.Unlock()
		}(min(perConn, n-c*perConn))
	}
	wg.Wait()
	return opened
}

// h2conn is the attacker's side of one HTTP/2 connection with flow
// control: it sends only what the node's windows allow.
type h2conn struct {
	fr      *http2.Framer
	wmu     sync.Mutex // frames
	mu      sync.Mutex
	cond    *sync.Cond
	connWin int64
	initWin int64
	win     map[uint32]int64
	dead    map[uint32]bool
	closed  bool
}

func incompleteConn(addr string, streams, msgLen int) int {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0
	}
	// The connection stays open (held by the process) after the writes.
	bw := bufio.NewWriterSize(c, 64<<10)
	fmt.Fprint(bw, http2.ClientPreface)
	h := &h2conn{fr: http2.NewFramer(bw, c), connWin: 65535, initWin: 65535, win: map[uint32]int64{}, dead: map[uint32]bool{}}
	h.cond = sync.NewCond(&h.mu)
	_ = h.fr.WriteSettings()
	_ = bw.Flush()
	go h.read()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	opened := 0
	for i := range streams {
		id := uint32(2*i + 1)
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/tollgate.v1.Tracker/TrackSeries"},
			{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		h.mu.Lock()
		h.win[id] = h.initWin
		h.mu.Unlock()
		h.wmu.Lock()
		err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		_ = bw.Flush()
		h.wmu.Unlock()
		if err != nil {
			break
		}
		opened++
		msg := make([]byte, msgLen) // prefix: uncompressed, msgLen-5 bytes follow; send one byte short
		msg[0] = 0
		msg[1], msg[2], msg[3], msg[4] = byte((msgLen-5)>>24), byte((msgLen-5)>>16), byte((msgLen-5)>>8), byte(msgLen-5)
		go h.send(bw, id, msg[:msgLen-1])
	}
	return opened
}

func (h *h2conn) send(bw *bufio.Writer, id uint32, data []byte) {
	for len(data) > 0 {
		h.mu.Lock()
		deadline := time.Now().Add(5 * time.Second)
		for !h.closed && !h.dead[id] && (h.connWin <= 0 || h.win[id] <= 0) && time.Now().Before(deadline) {
			h.cond.Wait()
		}
		if h.closed || h.dead[id] || h.connWin <= 0 || h.win[id] <= 0 {
			h.mu.Unlock()
			return
		}
		k := int64(min(len(data), 16<<10))
		k = min(k, h.connWin, h.win[id])
		h.connWin -= k
		h.win[id] -= k
		h.mu.Unlock()
		h.wmu.Lock()
		err := h.fr.WriteData(id, false, data[:k])
		_ = bw.Flush()
		h.wmu.Unlock()
		if err != nil {
			return
		}
		data = data[k:]
	}
}

func (h *h2conn) read() {
	// Wake waiters regularly so their deadlines are checked.
	go func() {
		for range time.Tick(time.Second) {
			h.cond.Broadcast()
		}
	}()
	for {
		f, err := h.fr.ReadFrame()
		h.mu.Lock()
		if err != nil {
			h.closed = true
			h.mu.Unlock()
			h.cond.Broadcast()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					for id := range h.win {
						h.win[id] += int64(v) - h.initWin
					}
					h.initWin = int64(v)
				}
				h.wmu.Lock()
				_ = h.fr.WriteSettingsAck()
				h.wmu.Unlock()
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				h.connWin += int64(f.Increment)
			} else {
				h.win[f.StreamID] += int64(f.Increment)
			}
		case *http2.RSTStreamFrame:
			h.dead[f.StreamID] = true
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				h.dead[f.StreamID] = true
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.wmu.Lock()
				_ = h.fr.WritePing(true, f.Data)
				h.wmu.Unlock()
			}
		case *http2.GoAwayFrame:
			h.closed = true
		}
		h.mu.Unlock()
		h.cond.Broadcast()
	}
}

// floodH2Idle opens n connections that send the HTTP/2 preface and
// settings and then nothing, reading (and dropping) what the node sends.
func floodH2Idle(addr string, n int) int {
	var opened atomic.Int64
	dialMany(addr, n, func(_ int, c net.Conn) {
		fmt.Fprint(c, http2.ClientPreface)
		_ = http2.NewFramer(c, nil).WriteSettings()
		go func() { _, _ = io.Copy(io.Discard, c) }()
		opened.Add(1)
	})
	return int(opened.Load())
}

// processFootprint is what the test process holds: resident memory,
// goroutines and open file descriptors.
type processFootprint struct {
	rssMB      float64
	goroutines int
	fds        int
}

func footprint(t *testing.T) processFootprint {
	t.Helper()
	runtime.GC()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status (%v): the flood test measures a Linux process", err)
	}
	var f processFootprint
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			f.rssMB = float64(kb) / 1024
		}
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	f.fds = len(ents)
	f.goroutines = runtime.NumGoroutine()
	return f
}

// groupLeaders names each group's leader, for the log.
func groupLeaders(tc *testCluster) string {
	var b strings.Builder
	for g := range 4 {
		fmt.Fprintf(&b, "%d:%s ", g, tc.leader(g).NodeID())
	}
	return b.String()
}

// healthLatency asks addr's /healthz on a new connection and returns how
// long the answer took (an error when none came within 10s).
func healthLatency(addr string) (time.Duration, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "ok" {
		return 0, fmt.Errorf("%d %q", resp.StatusCode, b)
	}
	return time.Since(start), nil
}

// TestPreAuthFloods: against one node of a three-node cluster with
// credentials (the documented production setup), from other processes,
// without any credential: 1,000 gRPC messages that never complete (each
// announcing the node's receive limit), several thousand idle HTTP/2
// connections to the gRPC port, and slow request bodies (to a route that
// needs a credential, and to a public one), and slow headers to the HTTP
// port, together beyond its connection cap.
// The node's resident memory grows by at most 200 MB (the incomplete
// messages once held a receive buffer each: 300 streams added 650 MB), it
// holds at most its gRPC connection cap, /healthz answers within 1 s
// (best of three tries per round: the machine running the test is loaded,
// the bar is the node's), and every group still commits through raft.
func TestPreAuthFloods(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a node with thousands of connections; skipped with -short")
	}
	streams := 1000
	if v := os.Getenv("TOLLGATE_HOSTILE_STREAMS"); v != "" { // smaller for a check against a build without the bound
		streams, _ = strconv.Atoi(v)
	}
	// TOLLGATE_HOSTILE_FULL=1: the bars at full size (50,000 idle
	// connections to each of the gRPC, HTTP, raft and gossip ports, 4,096
	// slow bodies, /healthz probed from before the first flood to the end).
	full := os.Getenv("TOLLGATE_HOSTILE_FULL") == "1"
	idle, slow, slowPublic := 3000, 500, 1000
	perProc := 0
	if full {
		idle, slow, slowPublic = 50_000, 4096, 4096
		// One attacker process holds at most its descriptor limit (hard
		// limit less headroom; it raises its soft limit to that) and one
		// source address ~28,000 ports per destination: a 50,000 flood
		// is split across processes, each with its own source address.
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Skipf("full-size floods: RLIMIT_NOFILE: %v", err)
		}
		if rl.Max < 5000 {
			t.Skipf("full-size floods split 50,000 connections over attacker processes of at most RLIMIT_NOFILE each: hard limit %d is too small (raise `ulimit -Hn`)", rl.Max)
		}
		perProc = min(int(rl.Max)-1024, 20_000)
		t.Logf("full size; RLIMIT_NOFILE soft %d hard %d (the node's process keeps its own); %d connections per attacker process", rl.Cur, rl.Max, perProc)
	}
	const grpcCap, httpCap = 1000, 512
	creds := writeCredentials(t)
	tc := startCluster(t, 3, func(_ int, c *Config) {
		c.Access.AdminToken, c.Access.CredentialsFile, c.Node.HTTPAddr = testToken, creds, "127.0.0.1:0"
		c.Bounds.GRPCMaxConns, c.Bounds.GRPCMaxConnsPerPeer, c.Bounds.HTTPMaxConns = grpcCap, grpcCap, httpCap
		// No leader balancing: a leadership it hands over on purpose
		// (one node often leads every group right after the start) is not
		// a move the floods caused.
		c.Cluster.LeaderBalanceInterval = -1
	})
	target := tc.leader(0)
	leadersBefore := groupLeaders(tc)
	msgLen := max(16+target.cfg.Tracking.MaxHashesPerRequest*8+1024, 2*snapshotChunkSize) // the receive limit
	before := footprint(t)
	t.Logf("before: %.0f MB RSS, %d goroutines, %d fds", before.rssMB, before.goroutines, before.fds)

	var probe *healthProbe
	if full {
		probe = startHealthProbe(target.HTTPAddr(), func() string {
			hc := target.httpCap
			r := hc.Refusals()
			return fmt.Sprintf("open %d, evicted %d, refused %d (at accept %d, head incomplete %d, of which gave way %d), answered by the cap %d",
				hc.Open(), hc.Evicted(), hc.Refused(), r.AtAccept, r.NoHead, r.GaveWay, hc.HealthAnsweredBeyondCap())
		})
		t.Logf("/healthz probe started at %s", time.Now().UTC().Format("15:04:05.000"))
	}
	probe.setPhase("grpc-incomplete")
	startFlood(t, "grpc-incomplete:"+strconv.Itoa(msgLen), target.GRPCAddr(), streams)
	probe.setPhase("grpc-h2-idle")
	if full {
		for k, left := 0, idle; left > 0; k, left = k+1, left-perProc {
			startFloodFrom(t, "h2-idle", target.GRPCAddr(), min(left, perProc), 100+k)
		}
	} else {
		startFlood(t, "h2-idle", target.GRPCAddr(), idle)
	}
	if full {
		fp := footprint(t)
		t.Logf("after the gRPC floods: %.0f MB RSS, %d goroutines, %d fds", fp.rssMB, fp.goroutines, fp.fds)
	}
	probe.setPhase("http-slow")
	startFlood(t, "slow", target.HTTPAddr(), slow)
	startFlood(t, "slow-headers", target.HTTPAddr(), 500)
	startFlood(t, "slow-public", target.HTTPAddr(), slowPublic)
	if full {
		// Each attacker process its own loopback source address, 127.0.0.2
		// up (the flood above came from 127.0.0.1).
		src := 1
		for i, f := range [][2]string{{"idle", target.HTTPAddr()}, {"tcp-idle", raftEndpoint(target)}, {"tcp-idle", target.GossipAddr()}} {
			probe.setPhase([]string{"http-idle", "raft-idle", "gossip-idle"}[i])
			for left := idle; left > 0; left -= perProc {
				startFloodFrom(t, f[0], f[1], min(left, perProc), src)
				src++
			}
			fp := footprint(t)
			t.Logf("after %s to %s: %.0f MB RSS, %d goroutines, %d fds", f[0], f[1], fp.rssMB, fp.goroutines, fp.fds)
		}
	}
	probe.setPhase("all floods held")
	time.Sleep(3 * time.Second) // the incomplete messages' bytes arrive

	var lat []time.Duration
	for round := range 5 {
		best := time.Duration(-1)
		var lastErr error
		for range 3 {
			d, err := healthLatency(target.HTTPAddr())
			if err != nil {
				lastErr = err
				continue
			}
			if best < 0 || d < best {
				best = d
			}
		}
		if best < 0 {
			t.Fatalf("/healthz round %d under the floods: no answer (%v)", round, lastErr)
		}
		lat = append(lat, best)
		time.Sleep(200 * time.Millisecond)
	}
	if probe != nil {
		n, slowN, failed, worst := probe.stop()
		t.Logf("/healthz probed every 250 ms from before the first flood (single tries, new connection each): %d probes, %d over 1s, %d without an answer, slowest %v", n, slowN, failed, worst)
		for _, e := range probe.errs {
			t.Logf("/healthz probe: %s", e)
		}
		for _, ph := range probe.order {
			c := probe.byPhase[ph]
			t.Logf("/healthz during %s: %d probes, %d over 1s, %d without an answer", ph, c[0], c[1], c[2])
		}
		if slowN > 0 || failed > 0 {
			t.Errorf("/healthz under the full-size floods: %d of %d probes over 1s, %d without an answer", slowN, n, failed)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("/healthz under the floods, best of 3 per round: %v", lat)
	if lat[len(lat)-1] > time.Second {
		t.Errorf("/healthz took %v under the floods, bar 1s", lat[len(lat)-1])
	}

	after := footprint(t)
	t.Logf("under the floods: %.0f MB RSS (+%.0f), %d goroutines, %d fds; gRPC connections %d (evicted %d, refused %d); HTTP connections %d (evicted %d, refused %d, health checks answered by the cap %d)",
		after.rssMB, after.rssMB-before.rssMB, after.goroutines, after.fds, target.grpcCap.Open(), target.grpcCap.Evicted(), target.grpcCap.Refused(),
		target.httpCap.Open(), target.httpCap.Evicted(), target.httpCap.Refused(), target.httpCap.HealthAnsweredBeyondCap())
	rs, gs := target.host.MuxStats(), target.members.StreamStats()
	t.Logf("raft port: %d pending, %d refused at the pending cap; gossip port: %d streams open, %d refused", rs.Pending, rs.Refused, gs.Open, gs.Refused)
	if full && (rs.Refused == 0 || gs.Refused == 0) {
		t.Errorf("the full-size floods did not reach the raft (%d refused) or gossip (%d refused) caps", rs.Refused, gs.Refused)
	}
	// The race detector multiplies what each goroutine and connection
	// holds (+356 MB in CI where a plain build grows +58 to +98 MB): the
	// bar's 200 MB holds for the build operators run; under -race the
	// bound is 800 MB, still far below the ~2 GB 1,000 incomplete messages
	// held before authentication came first (about 2 MB each).
	bound := 200.0
	if raceEnabled {
		bound = 800
	}
	if growth := after.rssMB - before.rssMB; growth > bound {
		t.Errorf("resident memory grew %.0f MB under unauthenticated floods, bound %.0f MB", growth, bound)
	}
	if n := target.grpcCap.Open(); n > grpcCap {
		t.Errorf("node holds %d gRPC connections, cap %d", n, grpcCap)
	}
	if target.grpcCap.Evicted() == 0 {
		t.Error("no idle gRPC connection was evicted: the flood did not reach the cap")
	}

	// Raft still commits in every group, through each group's leader, and
	// gossip still sees every node alive.
	for g := range 4 {
		tc.trackLeader(g, "flooded", g*16, hashesIn(uint64(g), g*16, 5))
	}
	waitApplied(t, tc, 0)
	alive := 0
	for _, m := range target.members.Members() {
		if m.Status == membership.StatusAlive {
			alive++
		}
	}
	if alive != 3 {
		t.Errorf("the flooded node's gossip sees %d alive members, want 3", alive)
	}
	// Leaderships: the flooded node's health never failed, so nothing made
	// it hand them away. At full size that is the bar and fails
	// the test; at the smaller default size (run in CI beside other
	// suites) a move on a loaded machine (an election timeout under CPU
	// starvation) is logged.
	if after := groupLeaders(tc); after != leadersBefore {
		if full {
			t.Errorf("group leaders moved during the full-size floods: %s → %s", leadersBefore, after)
		} else {
			t.Logf("group leaders moved during the floods: %s → %s", leadersBefore, after)
		}
	} else {
		t.Logf("group leaders unchanged: %s", after)
	}
}

// healthProbe asks /healthz every 250 ms until stopped.
type healthProbe struct {
	done    chan struct{}
	wg      sync.WaitGroup
	n, slow int
	failed  int
	worst   time.Duration
	errs    []string // the first few failures and slow answers, with when

	mu      sync.Mutex
	phase   string            // the flood being opened (setPhase)
	order   []string          // phases in the order set
	byPhase map[string][3]int // phase → probes, slow, failed
}

// setPhase names the flood being opened, for the per-phase counts (a nil
// probe ignores it).
func (p *healthProbe) setPhase(ph string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase = ph
	p.order = append(p.order, ph)
}

func (p *healthProbe) count(slow, failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.byPhase[p.phase]
	c[0]++
	if slow {
		c[1]++
	}
	if failed {
		c[2]++
	}
	p.byPhase[p.phase] = c
}

func startHealthProbe(addr string, state func() string) *healthProbe {
	p := &healthProbe{done: make(chan struct{}), phase: "start", order: []string{"start"}, byPhase: map[string][3]int{}}
	start := time.Now()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-p.done:
				return
			case <-time.After(250 * time.Millisecond):
			}
			at := time.Since(start).Round(time.Millisecond)
			was := state()
			d, err := healthLatency(addr)
			p.count(err == nil && d > time.Second, err != nil)
			p.n++
			switch {
			case err != nil:
				p.failed++
				if len(p.errs) < 40 {
					p.errs = append(p.errs, fmt.Sprintf("at +%v: %v (HTTP cap before the probe: %s; after: %s)", at, err, was, state()))
				}
			case d > time.Second:
				p.slow++
				if len(p.errs) < 40 {
					p.errs = append(p.errs, fmt.Sprintf("at +%v: %v", at, d))
				}
			}
			p.worst = max(p.worst, d)
		}
	}()
	return p
}

func (p *healthProbe) stop() (n, slow, failed int, worst time.Duration) {
	close(p.done)
	p.wg.Wait()
	return p.n, p.slow, p.failed, p.worst
}

// raftEndpoint is s's raft host:port (RaftAddr carries the incarnation).
func raftEndpoint(s *Server) string {
	ep, _ := raftnode.SplitIncarnation(s.RaftAddr())
	return ep
}
