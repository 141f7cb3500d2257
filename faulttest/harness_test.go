package faulttest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/testports"
)

// Generous bounds: they only catch hangs, they are not timing assertions.
const (
	readyTimeout    = 120 * time.Second // a started node prints "ready"
	healthyTimeout  = 120 * time.Second // every group has a leader and 3 voters
	leaderTimeout   = 60 * time.Second  // a group elects a new leader
	progressTimeout = 60 * time.Second  // writes succeed again after a fault
	exitTimeout     = 60 * time.Second  // a signalled process exits
	adminCallTO     = 3 * time.Second
	adminToken      = "faulttest-token"
	// gossipKey: a cluster with an admin token needs a gossip key (or
	// TLS) to start; it is also the key the nodes authenticate to each
	// other with.
	gossipKey  = "ZmF1bHR0ZXN0IGdvc3NpcCBrZXksIDMyIGJ5dGVzISE="
	partitions = api.DefaultPartitions
	groups     = api.DefaultGroups
)

var zones = []string{"zone-a", "zone-b", "zone-c"}

// ---------------------------------------------------------------------------
// The binary: built once per `go test` run.

var (
	buildOnce sync.Once
	buildDir  string
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if brokenBin != "" {
		_ = os.RemoveAll(filepath.Dir(brokenBin))
	}
	os.Exit(code)
}

// tollgateBinary returns the path of a tollgate binary built from this module
// (or $TOLLGATE_BIN when set). Another engineer may be rewriting packages the
// binary depends on, so a failed build is retried for a few minutes.
func tollgateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("TOLLGATE_BIN"); p != "" {
			binPath, buildErr = filepath.Abs(p)
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "tollgate-faulttest-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "tollgate")
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		deadline := time.Now().Add(5 * time.Minute)
		for attempt := 1; ; attempt++ {
			cmd := exec.Command("go", "build", "-o", binPath, "./cmd/tollgate")
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err == nil {
				buildErr = nil
				return
			}
			buildErr = fmt.Errorf("go build ./cmd/tollgate (attempt %d): %v\n%s", attempt, err, out)
			if time.Now().After(deadline) {
				return
			}
			fmt.Fprintf(os.Stderr, "faulttest: %v\nfaulttest: retrying in 30s (the tree may be mid-edit)\n", buildErr)
			time.Sleep(30 * time.Second)
		}
	})
	if buildErr != nil {
		t.Fatalf("building tollgate: %v", buildErr)
	}
	return binPath
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

// ---------------------------------------------------------------------------
// Ports.

// ports: faulttest's range, below the ephemeral range (an outgoing
// connection cannot take a node's port while the node is down) and apart
// from cmd/tollgate's tests (10000–19999), which run beside these.
var ports = testports.Range{Lo: 20000, Hi: 32000}

// freePort returns a loopback port free for both TCP and UDP (serf needs
// both).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := ports.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ---------------------------------------------------------------------------
// Nodes.

type node struct {
	c        *cluster
	idx      int
	id, zone string
	dir      string
	grpcAddr string
	httpAddr string
	args     []string
	outPath  string // stdout, appended across restarts
	errPath  string // stderr, appended across restarts

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current process has exited
	exitErr  error
	expected bool // the current process was signalled to end
	stopped  bool // SIGSTOPped
	starts   int
	crashes  []string
}

// readyWriter copies a node's stdout to its file and reports the "ready" line.
type readyWriter struct {
	f     *os.File
	mu    sync.Mutex
	buf   []byte
	ready chan struct{}
	once  sync.Once
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf != nil {
		w.buf = append(w.buf, p...)
		if bytes.Contains(w.buf, []byte("ready")) {
			w.once.Do(func() { close(w.ready) })
			w.buf = nil
		} else if len(w.buf) > 64 {
			w.buf = append(w.buf[:0], w.buf[len(w.buf)-8:]...)
		}
	}
	return w.f.Write(p)
}

func (n *node) String() string { return n.id }

func (n *node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !isClosed(n.exited)
}

func (n *node) isStopped() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopped
}

// usable: running and not frozen.
func (n *node) usable() bool { return n.running() && !n.isStopped() }

func isClosed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// start launches the process and returns a channel closed when it prints "ready".
func (n *node) start() (<-chan struct{}, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !isClosed(n.exited) {
		return nil, fmt.Errorf("%s is already running", n.id)
	}
	n.starts++
	marker := fmt.Sprintf("===== faulttest: start #%d of %s at %s =====\n", n.starts, n.id, time.Now().Format(time.RFC3339Nano))
	out, err := os.OpenFile(n.outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	errf, err := os.OpenFile(n.errPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		_ = out.Close()
		return nil, err
	}
	_, _ = out.WriteString(marker)
	_, _ = errf.WriteString(marker)
	rw := &readyWriter{f: out, buf: []byte{}, ready: make(chan struct{})}
	cmd := exec.Command(n.c.bin, n.args...)
	cmd.Stdout = rw
	cmd.Stderr = errf
	// Pdeathsig: if the test binary dies (panic, timeout), its nodes die too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		_ = errf.Close()
		return nil, fmt.Errorf("start %s: %w", n.id, err)
	}
	exited := make(chan struct{})
	n.cmd, n.exited, n.exitErr, n.expected, n.stopped = cmd, exited, nil, false, false
	go func() {
		err := cmd.Wait()
		_ = out.Close()
		_ = errf.Close()
		n.mu.Lock()
		n.exitErr = err
		if !n.expected {
			n.crashes = append(n.crashes, fmt.Sprintf("%s exited unexpectedly at %s: %v", n.id, time.Now().Format(time.RFC3339Nano), err))
		}
		n.mu.Unlock()
		close(exited)
	}()
	return rw.ready, nil
}

// startAndWait starts the node and waits for its "ready" line.
func (n *node) startAndWait(t *testing.T) {
	t.Helper()
	ready, err := n.start()
	if err != nil {
		t.Fatal(err)
	}
	n.waitReady(t, ready)
}

func (n *node) waitReady(t *testing.T, ready <-chan struct{}) {
	t.Helper()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("%s exited before it was ready: %v", n.id, n.exitErr)
	case <-time.After(readyTimeout):
		t.Fatalf("%s not ready after %v (hang?)", n.id, readyTimeout)
	}
}

func (n *node) signal(sig syscall.Signal, expectExit bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || isClosed(n.exited) {
		return fmt.Errorf("%s is not running", n.id)
	}
	if expectExit {
		n.expected = true
	}
	return syscall.Kill(n.cmd.Process.Pid, sig)
}

func (n *node) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	select {
	case <-exited:
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.exitErr
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %v", n.id, timeout)
	}
}

// kill SIGKILLs the node (SIGCONT first if frozen) and waits for it to exit.
func (n *node) kill(t *testing.T) {
	t.Helper()
	if n.isStopped() {
		n.cont(t)
	}
	if err := n.signal(syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if err := n.waitExit(t, exitTimeout); err != nil && !isSignalExit(err) {
		t.Fatalf("SIGKILL %s: %v", n.id, err)
	}
	t.Logf("%s: SIGKILLed", n.id)
}

// term SIGTERMs the node (graceful stop) and waits for a clean exit.
func (n *node) term(t *testing.T) {
	t.Helper()
	if err := n.signal(syscall.SIGTERM, true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := n.waitExit(t, exitTimeout)
	if err != nil && strings.Contains(err.Error(), "did not exit") {
		_ = n.signal(syscall.SIGKILL, true)
		_ = n.waitExit(t, exitTimeout)
		t.Fatalf("graceful stop of %s hangs: %v", n.id, err)
	}
	if err != nil {
		t.Errorf("%s: graceful stop (SIGTERM) ended with %v, want exit status 0", n.id, err)
	}
	t.Logf("%s: stopped by SIGTERM in %v", n.id, time.Since(start).Round(time.Millisecond))
}

func (n *node) stop(t *testing.T) {
	t.Helper()
	if err := n.signal(syscall.SIGSTOP, false); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	t.Logf("%s: SIGSTOPped", n.id)
}

func (n *node) cont(t *testing.T) {
	t.Helper()
	if err := n.signal(syscall.SIGCONT, false); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.stopped = false
	n.mu.Unlock()
	t.Logf("%s: SIGCONTed", n.id)
}

// restart starts the node again with the same flags and data dir.
func (n *node) restart(t *testing.T) {
	t.Helper()
	start := time.Now()
	n.startAndWait(t)
	t.Logf("%s: restarted, ready in %v", n.id, time.Since(start).Round(time.Millisecond))
}

func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	return false
}

// forceKill is the cleanup path: never fails, never blocks for long.
func (n *node) forceKill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	if cmd != nil && !isClosed(exited) {
		n.expected = true
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		n.stopped = false
	}
	n.mu.Unlock()
	if exited != nil {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	}
}

func (n *node) takeCrashes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.crashes
	n.crashes = nil
	return c
}

// ---------------------------------------------------------------------------
// The cluster.

type clusterOptions struct {
	defaultMaxSeries int64
	// tenantMaxSeries are per-tenant overrides written to a --limits-file.
	tenantMaxSeries map[string]int64
	// shareMode is passed as --share-mode when set (the server's default is
	// movable).
	shareMode string
	// extraArgs are appended to every node's command line.
	extraArgs []string
	// dataDirs overrides the data dir of a node by id (default: under the
	// cluster's temp dir), e.g. to put one node on a small filesystem.
	dataDirs map[string]string
	// clientTLS, when set, is how the harness and the checker dial the nodes'
	// gRPC (clusters started with --tls-cert in extraArgs).
	clientTLS *tls.Config
	// bin, when set, is the binary the nodes start with (an earlier build, for
	// upgrade tests; cluster.bin can be changed before restarts). Default: this
	// module's build.
	bin string
	// nodeArgs are appended to one node's command line (index 0 = node-1),
	// after extraArgs: e.g. a shifted clock (--test-clock-offset) on one node.
	nodeArgs map[int][]string
}

type cluster struct {
	t     *testing.T
	bin   string
	dir   string
	opts  clusterOptions
	nodes []*node

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn

	histories int // recorders started (historyPath numbers them)
}

// dialOptions keep reconnection quick: a node that was down for a few seconds
// must be reachable again at once, not after gRPC's default backoff (up to 2 min).
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The nodes run with an admin token, so no endpoint that writes or
		// reveals tenant data answers without a credential.
		grpc.WithPerRPCCredentials(defaultToken(adminToken)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
	}
}

// defaultToken sends "authorization: Bearer <token>" with calls that carry
// no authorization of their own.
type defaultToken string

func (t defaultToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get("authorization")) > 0 {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (defaultToken) RequireTransportSecurity() bool { return false }

// tokenTransport adds the admin token to HTTP requests without an
// Authorization header: the dashboard data needs the read scope.
type tokenTransport struct{}

func (tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+adminToken)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// newCluster starts three nodes (zones a/b/c) with --bootstrap-expect 3 and
// waits until they are ready and healthy. Every process is killed in
// t.Cleanup, and on failure the tail of every node's logs is printed.
func newCluster(t *testing.T, opts clusterOptions) *cluster {
	t.Helper()
	bin := opts.bin
	if bin == "" {
		bin = tollgateBinary(t)
	}
	c := &cluster{t: t, bin: bin, dir: t.TempDir(), opts: opts, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(c.cleanup) // registered before anything starts: runs on failure and panic too

	limitsFile := ""
	if len(opts.tenantMaxSeries) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "defaults:\n  max_series: %d\ntenants:\n", opts.defaultMaxSeries)
		names := make([]string, 0, len(opts.tenantMaxSeries))
		for name := range opts.tenantMaxSeries {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if v := opts.tenantMaxSeries[name]; v == 0 {
				fmt.Fprintf(&b, "  %s:\n    unlimited: true\n", name)
			} else {
				fmt.Fprintf(&b, "  %s:\n    max_series: %d\n", name, v)
			}
		}
		limitsFile = filepath.Join(c.dir, "limits.yaml")
		if err := os.WriteFile(limitsFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	type addrs struct{ grpc, raft, gossip, http string }
	var as []addrs
	for range 3 {
		as = append(as, addrs{
			grpc:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			raft:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			gossip: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			http:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
	}
	for i := range 3 {
		id := fmt.Sprintf("node-%d", i+1)
		n := &node{c: c, idx: i, id: id, zone: zones[i], dir: filepath.Join(c.dir, id), grpcAddr: as[i].grpc, httpAddr: as[i].http,
			outPath: filepath.Join(c.dir, id+".stdout"), errPath: filepath.Join(c.dir, id+".stderr")}
		if d := opts.dataDirs[id]; d != "" {
			n.dir = d
		}
		n.args = []string{"server", "--node-id", id, "--zone", zones[i], "--data-dir", n.dir,
			"--grpc-addr", as[i].grpc, "--raft-addr", as[i].raft, "--gossip-addr", as[i].gossip, "--http-addr", as[i].http,
			"--bootstrap-expect", "3", "--admin-token", adminToken,
			"--default-max-series", fmt.Sprint(opts.defaultMaxSeries)}
		if i > 0 {
			n.args = append(n.args, "--join", as[0].gossip)
		}
		if limitsFile != "" {
			n.args = append(n.args, "--limits-file", limitsFile)
		}
		if opts.shareMode != "" {
			n.args = append(n.args, "--share-mode", opts.shareMode)
		}
		if !slices.Contains(opts.extraArgs, "--gossip-keyring-file") {
			n.args = append(n.args, "--gossip-key", gossipKey)
		}
		n.args = append(n.args, opts.extraArgs...)
		n.args = append(n.args, opts.nodeArgs[i]...)
		// Measurement runs try server settings without a code change, e.g.
		// TOLLGATE_FAULTTEST_SERVER_ARGS="--raft-heartbeat-timeout 300ms".
		n.args = append(n.args, strings.Fields(os.Getenv("TOLLGATE_FAULTTEST_SERVER_ARGS"))...)
		c.nodes = append(c.nodes, n)
	}
	start := time.Now()
	var readies []<-chan struct{}
	for _, n := range c.nodes {
		r, err := n.start()
		if err != nil {
			t.Fatal(err)
		}
		readies = append(readies, r)
	}
	for i, n := range c.nodes {
		n.waitReady(t, readies[i])
	}
	c.waitHealthy()
	t.Logf("cluster of 3 nodes healthy in %v (logs in %s)", time.Since(start).Round(time.Millisecond), c.dir)
	return c
}

func (c *cluster) cleanup() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.forceKill() }()
	}
	wg.Wait()
	c.connMu.Lock()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	c.connMu.Unlock()
	if c.t.Failed() {
		c.dumpLogs(60)
	}
	if keep := os.Getenv("TOLLGATE_FAULTTEST_LOGDIR"); keep != "" {
		dst := filepath.Join(keep, strings.ReplaceAll(c.t.Name(), "/", "_"))
		if err := os.MkdirAll(dst, 0o755); err == nil {
			// The recorded history and its visualisation, when a test keeps one.
			keep, _ := filepath.Glob(filepath.Join(c.dir, "history.*"))
			for _, n := range c.nodes {
				keep = append(keep, n.outPath, n.errPath)
			}
			for _, p := range keep {
				if b, err := os.ReadFile(p); err == nil {
					_ = os.WriteFile(filepath.Join(dst, filepath.Base(p)), b, 0o644)
				}
			}
			c.t.Logf("node logs copied to %s", dst)
		}
	}
}

func (c *cluster) dumpLogs(lines int) {
	for _, n := range c.nodes {
		for _, p := range []string{n.outPath, n.errPath} {
			c.t.Logf("----- last %d lines of %s -----\n%s", lines, filepath.Base(p), tail(p, lines))
		}
	}
}

func tail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	const max = 256 << 10
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	var ring []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		ring = append(ring, sc.Text())
		if len(ring) > lines {
			ring = ring[1:]
		}
	}
	return strings.Join(ring, "\n")
}

// checkNoCrashes fails the test if a node exited without being signalled.
func (c *cluster) checkNoCrashes() {
	c.t.Helper()
	for _, n := range c.nodes {
		for _, msg := range n.takeCrashes() {
			c.t.Errorf("node crash: %s", msg)
		}
	}
}

func (c *cluster) conn(addr string) *grpc.ClientConn {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	cc := c.conns[addr]
	if cc == nil {
		var err error
		opts := dialOptions()
		if c.opts.clientTLS != nil {
			opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(c.opts.clientTLS))) // the last one counts
		}
		cc, err = grpc.NewClient(addr, opts...)
		if err != nil {
			c.t.Fatalf("dial %s: %v", addr, err)
		}
		c.conns[addr] = cc
	}
	return cc
}

func (c *cluster) admin(n *node) api.AdminClient { return api.NewAdminClient(c.conn(n.grpcAddr)) }

func adminCtx(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx := metadata.AppendToOutgoingContext(parent, "authorization", "Bearer "+adminToken)
	return context.WithTimeout(ctx, timeout)
}

func (c *cluster) grpcAddrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.grpcAddr)
	}
	return out
}

// nodeGroups asks every usable node for its local raft state, in parallel.
func (c *cluster) nodeGroups() map[*node]*api.NodeGroupsResponse {
	out := map[*node]*api.NodeGroupsResponse{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if !n.usable() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := adminCtx(context.Background(), adminCallTO)
			defer cancel()
			resp, err := c.admin(n).NodeGroups(ctx, &api.NodeGroupsRequest{})
			if err == nil {
				mu.Lock()
				out[n] = resp
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// leaderOf returns the node whose raft reports itself leader of g (the one
// with the highest term if a stale leader still thinks it leads), or nil.
func (c *cluster) leaderOf(g int) (*node, uint64) {
	var best *node
	var bestTerm uint64
	for n, ng := range c.nodeGroups() {
		for _, gs := range ng.Groups {
			if int(gs.Group) == g && gs.RaftState == "Leader" && (best == nil || gs.Term > bestTerm) {
				best, bestTerm = n, gs.Term
			}
		}
	}
	return best, bestTerm
}

// waitLeader waits until g has a leader other than not (nil: any leader).
func (c *cluster) waitLeader(g int, not *node) *node {
	c.t.Helper()
	start := time.Now()
	for time.Since(start) < leaderTimeout {
		if l, _ := c.leaderOf(g); l != nil && l != not {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("group %d: no new leader within %v (hang?)", g, leaderTimeout)
	return nil
}

// leaders maps each group to its current leader (nil entries: none known).
func (c *cluster) leaders() []*node {
	out := make([]*node, groups)
	for g := range groups {
		out[g], _ = c.leaderOf(g)
	}
	return out
}

// health describes what keeps the cluster from being healthy ("" = healthy):
// every node runs and answers, every group has exactly one leader that every
// node follows, and the leader's configuration has 3 voters.
func (c *cluster) health() string {
	for _, n := range c.nodes {
		if !n.usable() {
			return n.id + " is not running"
		}
	}
	ngs := c.nodeGroups()
	for _, n := range c.nodes {
		if ngs[n] == nil {
			return n.id + " does not answer NodeGroups"
		}
	}
	for g := range groups {
		var leader *node
		for _, n := range c.nodes {
			gs := groupState(ngs[n], g)
			if gs == nil {
				return fmt.Sprintf("%s reports nothing for group %d", n.id, g)
			}
			switch gs.RaftState {
			case "Leader":
				if leader != nil {
					return fmt.Sprintf("group %d: two leaders (%s, %s)", g, leader.id, n.id)
				}
				leader = n
			case "Follower":
			default:
				return fmt.Sprintf("group %d: %s is %s", g, n.id, gs.RaftState)
			}
		}
		if leader == nil {
			return fmt.Sprintf("group %d has no leader", g)
		}
		for _, n := range c.nodes {
			if gs := groupState(ngs[n], g); gs.LeaderId != leader.id {
				return fmt.Sprintf("group %d: %s thinks the leader is %q, not %s", g, n.id, gs.LeaderId, leader.id)
			}
		}
		peers, err := c.listPeers(leader, g)
		if err != nil {
			return fmt.Sprintf("group %d: ListPeers on %s: %v", g, leader.id, err)
		}
		if v := voters(peers); len(v) != 3 {
			return fmt.Sprintf("group %d: voters %v, want 3", g, v)
		}
	}
	return ""
}

func groupState(ng *api.NodeGroupsResponse, g int) *api.GroupState {
	if ng == nil {
		return nil
	}
	for _, gs := range ng.Groups {
		if int(gs.Group) == g {
			return gs
		}
	}
	return nil
}

func voters(peers []*api.Peer) []string {
	var out []string
	for _, p := range peers {
		if p.Suffrage == "Voter" {
			out = append(out, p.Id)
		}
	}
	sort.Strings(out)
	return out
}

func (c *cluster) listPeers(via *node, g int) ([]*api.Peer, error) {
	ctx, cancel := adminCtx(context.Background(), adminCallTO)
	defer cancel()
	resp, err := c.admin(via).ListPeers(ctx, &api.ListPeersRequest{Group: uint32(g)})
	if err != nil {
		return nil, err
	}
	return resp.Peers, nil
}

// waitHealthy waits until every group has a leader followed by all three
// nodes and 3 voters.
func (c *cluster) waitHealthy() {
	c.t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < healthyTimeout {
		if last = c.health(); last == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("cluster not healthy after %v (hang?): %s", healthyTimeout, last)
}

// describe is a one-line picture of the groups' leaders, for logs.
func (c *cluster) describe() string {
	var b strings.Builder
	for g, l := range c.leaders() {
		id := "-"
		if l != nil {
			id = l.id
		}
		fmt.Fprintf(&b, "g%d:%s ", g, id)
	}
	return strings.TrimSpace(b.String())
}
