package netpart

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/faulttest/checker"
	"github.com/tollgate-io/tollgate/faulttest/history"
)

// Generous bounds: they only catch hangs, they are not timing assertions.
const (
	dockerCmdTimeout = 3 * time.Minute  // one docker / docker-compose command
	readyTimeout     = 2 * time.Minute  // every container answers /readyz
	healthyTimeout   = 90 * time.Second // every group has a leader all nodes follow, 3 voters
	stepDownTimeout  = 30 * time.Second // a cut-off leader stops calling itself leader
	adminCallTO      = 3 * time.Second
	adminToken       = "netpart-token"
	// gossipKey: a cluster with an admin token refuses to start without a
	// gossip key (or TLS); a fixed test key (base64 of 32 bytes).
	gossipKey = "bmV0cGFydCB0ZXN0IGdvc3NpcCBrZXksIDMyIGJ5dGU="
	groups    = api.DefaultGroups
)

// ---------------------------------------------------------------------------
// One package run: the docker check, the binary, the image, and a registry of
// everything created so that it is removed on every way out.

type run struct {
	id       string // distinguishes this run's projects, networks and image
	root     string // module root
	skip     string // why the tests cannot run here ("" = they can)
	buildDir string
	image    string
	buildErr error
	once     sync.Once

	mu       sync.Mutex
	clusters map[*cluster]bool
}

// The package's one run: TestMain creates it; tests, the timeout watchdog and
// the signal handler reach it here.
var pkgRun *run

func TestMain(m *testing.M) {
	flag.Parse()
	pkgRun = &run{id: fmt.Sprintf("%d-%04x", os.Getpid(), rand.IntN(1<<16)), clusters: map[*cluster]bool{}}
	pkgRun.skip = dockerMissing()
	// A test binary killed by -timeout or a signal runs no t.Cleanup: remove
	// the containers before that can happen.
	stopWatch := pkgRun.watchdog()
	code := m.Run()
	stopWatch()
	pkgRun.removeAll()
	os.Exit(code)
}

// dockerMissing says why the package cannot run here, or "".
func dockerMissing() string {
	if _, err := exec.LookPath("docker-compose"); err != nil {
		return "docker-compose (v1) is not installed"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		return fmt.Sprintf("no Docker engine answers (docker info: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	return ""
}

// watchdog removes everything shortly before -test.timeout would kill the
// binary, and on SIGINT/SIGTERM.
func (r *run) watchdog() (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var timer <-chan time.Time
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 0 {
			margin := min(d/10, 45*time.Second)
			timer = time.After(d - margin)
		}
	}
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "netpart: %v: removing containers, networks, volumes and image\n", s)
			r.removeAll()
			os.Exit(2)
		case <-timer:
			fmt.Fprintln(os.Stderr, "netpart: the test timeout is near: removing containers, networks, volumes and image")
			r.removeAll()
		case <-done:
		}
	}()
	return func() { signal.Stop(sigs); close(done) }
}

func (r *run) removeAll() {
	r.mu.Lock()
	var cs []*cluster
	for c := range r.clusters {
		cs = append(cs, c)
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.down()
	}
	if r.image != "" {
		_, _ = docker(context.Background(), "", nil, "image", "rm", "-f", r.image)
	}
	if r.buildDir != "" {
		_ = os.RemoveAll(r.buildDir)
	}
}

// requireDocker skips the test, with the reason, where no engine answers.
func requireDocker(t *testing.T) {
	t.Helper()
	if pkgRun.skip != "" {
		t.Skipf("network-partition tests need Docker: %s", pkgRun.skip)
	}
}

// buildImage builds the static binary (CGO off) and a FROM-scratch image with
// it and the checker's limits file, once per package run.
func (r *run) buildImage(t *testing.T) string {
	t.Helper()
	r.once.Do(func() {
		start := time.Now()
		r.root, r.buildErr = moduleRoot()
		if r.buildErr != nil {
			return
		}
		if r.buildDir, r.buildErr = os.MkdirTemp("", "tollgate-netpart-"); r.buildErr != nil {
			return
		}
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(r.buildDir, "tollgate"), "./cmd/tollgate")
		build.Dir = r.root
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			r.buildErr = fmt.Errorf("go build ./cmd/tollgate: %v\n%s", err, out)
			return
		}
		if r.buildErr = os.WriteFile(filepath.Join(r.buildDir, "limits.yaml"), []byte(limitsYAML()), 0o644); r.buildErr != nil {
			return
		}
		image := "tollgate-netpart:" + r.id
		_, err := docker(context.Background(), "", nil, "build", "-q", "-t", image,
			"-f", filepath.Join(r.root, "faulttest", "netpart", "testdata", "Dockerfile"), r.buildDir)
		if err != nil {
			r.buildErr = fmt.Errorf("docker build: %w", err)
			return
		}
		r.image = image
		fmt.Fprintf(os.Stderr, "netpart: image %s built in %v\n", image, time.Since(start).Round(time.Millisecond))
	})
	if r.buildErr != nil {
		t.Fatalf("building the node image: %v", r.buildErr)
	}
	return r.image
}

// limitsYAML is the limits file matching checker.DefaultConfig's tenants.
func limitsYAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "defaults:\n  max_series: %d\ntenants:\n", checker.DefaultMaxSeries)
	for _, tn := range checker.DefaultTenants {
		if tn.MaxSeries != checker.DefaultMaxSeries {
			fmt.Fprintf(&b, "  %s:\n    max_series: %d\n", tn.Name, tn.MaxSeries)
		}
	}
	return b.String()
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

// docker runs the docker CLI (or docker-compose when args[0] is "compose")
// and returns its trimmed output.
func docker(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerCmdTimeout)
	defer cancel()
	name := "docker"
	if len(args) > 0 && args[0] == "compose" {
		name, args = "docker-compose", args[1:]
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// ---------------------------------------------------------------------------
// The cluster: three containers, one per zone, on two networks of its own.

type node struct {
	idx       int
	id, zone  string
	container string
	peerIP    string
	clientIP  string
	grpcAdv   string // advertised gRPC address (peers network)

	mu         sync.Mutex
	grpcHost   string // 127.0.0.1:published port; changes when the clients network is reconnected
	httpHost   string
	cutPeers   bool
	cutClients bool
}

func (n *node) String() string { return n.id }

func (n *node) hosts() (grpcHost, httpHost string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.grpcHost, n.httpHost
}

// reachable: the host can talk to it (its clients network is attached).
func (n *node) reachable() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.cutClients
}

type cluster struct {
	t        *testing.T
	r        *run
	project  string
	compose  string   // compose file
	env      []string // NETPART_* for docker-compose
	peersNet string
	clntNet  string
	nodes    []*node
	downOnce sync.Once

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn // by host address
}

// newCluster creates this test's networks (subnets docker accepts, so nothing
// clashes with the demo or another run), starts three nodes with
// --bootstrap-expect 3 and waits until the cluster is healthy. Everything is
// removed in t.Cleanup, with the nodes' logs printed first on failure.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterIdle(t, "20m")
}

// newClusterIdle is newCluster with the nodes' idle timeout.
func newClusterIdle(t *testing.T, idle string) *cluster {
	t.Helper()
	requireDocker(t)
	image := pkgRun.buildImage(t)
	ctx := context.Background()
	start := time.Now()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	c := &cluster{t: t, r: pkgRun, project: fmt.Sprintf("tollgate-netpart-%s-%s", pkgRun.id, name),
		compose: filepath.Join(pkgRun.root, "faulttest", "netpart", "testdata", "compose.yml"),
		conns:   map[string]*grpc.ClientConn{}}
	c.peersNet, c.clntNet = c.project+"-peers", c.project+"-clients"
	pkgRun.mu.Lock()
	pkgRun.clusters[c] = true
	pkgRun.mu.Unlock()
	t.Cleanup(c.cleanup) // before anything is created: runs on failure too

	peers := c.createNetwork(t, c.peersNet, true)
	clients := c.createNetwork(t, c.clntNet, false)
	c.env = []string{"NETPART_IMAGE=" + image, "NETPART_TOKEN=" + adminToken, "NETPART_GOSSIP_KEY=" + gossipKey,
		"NETPART_PEERS=" + peers, "NETPART_CLIENTS=" + clients,
		"NETPART_PEERS_NET=" + c.peersNet, "NETPART_CLIENTS_NET=" + c.clntNet,
		fmt.Sprintf("NETPART_DEFAULT_MAX_SERIES=%d", checker.DefaultMaxSeries), "NETPART_IDLE_TIMEOUT=" + idle}
	if _, err := c.composeCmd(ctx, "up", "-d", "--no-build"); err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	// One `docker ps` rather than a `docker-compose ps` per service: each
	// docker-compose (v1, Python) start costs seconds on a busy machine.
	out, err := docker(ctx, "", nil, "ps", "--filter", "label=com.docker.compose.project="+c.project,
		"--format", `{{.ID}} {{.Label "com.docker.compose.service"}}`)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if id, svc, ok := strings.Cut(line, " "); ok {
			ids[svc] = id
		}
	}
	for i := range 3 {
		svc := fmt.Sprintf("node-%d", i+1)
		if ids[svc] == "" {
			t.Fatalf("no running container for %s (docker ps: %q)", svc, out)
		}
		n := &node{idx: i, id: svc, zone: fmt.Sprintf("zone-%c", 'a'+i), container: ids[svc],
			peerIP: fmt.Sprintf("%s.%d", peers, 11+i), clientIP: fmt.Sprintf("%s.%d", clients, 11+i)}
		n.grpcAdv = n.peerIP + ":7300"
		c.discoverPorts(t, n)
		c.nodes = append(c.nodes, n)
	}
	c.waitReady(c.nodes...)
	readyAt := time.Now()
	c.waitHealthy()
	t.Logf("cluster %s: 3 containers healthy in %v (compose up %v, ready +%v, healthy +%v; peers %s.0/24, clients %s.0/24)",
		c.project, time.Since(start).Round(time.Millisecond), upAt.Sub(start).Round(time.Millisecond),
		readyAt.Sub(upAt).Round(time.Millisecond), time.Since(readyAt).Round(time.Millisecond), peers, clients)
	return c
}

// createNetwork creates a bridge network on a free /24 of 172.29.0.0/16
// (retrying where docker reports an overlap) and returns its prefix.
func (c *cluster) createNetwork(t *testing.T, name string, internal bool) string {
	t.Helper()
	var last error
	for range 40 {
		third := 100 + rand.IntN(150) // the demo uses 172.29.74.0/24
		prefix := fmt.Sprintf("172.29.%d", third)
		args := []string{"network", "create", "--driver", "bridge", "--subnet", prefix + ".0/24",
			"--label", "tollgate.netpart.run=" + c.r.id}
		if internal {
			// No gateway: a node cut off this network cannot reach it another way.
			args = append(args, "--internal")
		}
		if _, err := docker(context.Background(), "", nil, append(args, name)...); err != nil {
			last = err
			if strings.Contains(err.Error(), "overlap") || strings.Contains(err.Error(), "conflicts") {
				continue
			}
			t.Fatal(err)
		}
		return prefix
	}
	t.Fatalf("no free /24 in 172.29.0.0/16 for %s: %v", name, last)
	return ""
}

func (c *cluster) composeCmd(ctx context.Context, args ...string) (string, error) {
	return docker(ctx, "", c.env, append([]string{"compose", "-p", c.project, "-f", c.compose}, args...)...)
}

// discoverPorts reads the host ports docker published for the node.
func (c *cluster) discoverPorts(t *testing.T, n *node) {
	t.Helper()
	port := func(p string) string {
		out, err := docker(context.Background(), "", nil, "port", n.container, p+"/tcp")
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "127.0.0.1:") {
				return line
			}
		}
		t.Fatalf("%s: no 127.0.0.1 port for %s in %q", n.id, p, out)
		return ""
	}
	g, h := port("7300"), port("7380")
	n.mu.Lock()
	n.grpcHost, n.httpHost = g, h
	n.mu.Unlock()
}

// down removes containers, volumes and networks; idempotent, never fails.
func (c *cluster) down() {
	c.downOnce.Do(func() {
		ctx := context.Background()
		if c.env != nil {
			if _, err := c.composeCmd(ctx, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
				fmt.Fprintf(os.Stderr, "netpart: %v\n", err)
			}
		}
		for _, net := range []string{c.peersNet, c.clntNet} {
			_, _ = docker(ctx, "", nil, "network", "rm", net)
		}
		c.r.mu.Lock()
		delete(c.r.clusters, c)
		c.r.mu.Unlock()
	})
}

func (c *cluster) cleanup() {
	c.connMu.Lock()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	c.connMu.Unlock()
	if dir := os.Getenv("TOLLGATE_NETPART_LOGDIR"); dir != "" && c.env != nil {
		if out, err := c.composeCmd(context.Background(), "logs", "--no-color", "-t"); err == nil {
			path := filepath.Join(dir, c.project+".log")
			if err := os.WriteFile(path, []byte(out), 0o644); err == nil {
				c.t.Logf("node logs saved in %s", path)
			}
		}
	}
	if c.t.Failed() && c.env != nil {
		if out, err := c.composeCmd(context.Background(), "logs", "--no-color", "--tail", "80"); err == nil {
			c.t.Logf("----- last 80 lines of each node's log -----\n%s", out)
		}
	}
	c.down()
}

// ---------------------------------------------------------------------------
// Cuts.

// isolate disconnects n from the peers network: it keeps answering clients,
// but can no longer reach (or be reached by) the other nodes. It returns the
// moment the disconnect had taken effect.
func (c *cluster) isolate(n *node) time.Time {
	c.t.Helper()
	if _, err := docker(context.Background(), "", nil, "network", "disconnect", c.peersNet, n.container); err != nil {
		c.t.Fatal(err)
	}
	at := time.Now()
	n.mu.Lock()
	n.cutPeers = true
	n.mu.Unlock()
	return at
}

// rejoin reconnects n to the peers network with its old address.
func (c *cluster) rejoin(n *node) time.Time {
	c.t.Helper()
	if _, err := docker(context.Background(), "", nil, "network", "connect", "--ip", n.peerIP, c.peersNet, n.container); err != nil {
		c.t.Fatal(err)
	}
	at := time.Now()
	n.mu.Lock()
	n.cutPeers = false
	n.mu.Unlock()
	return at
}

// cutZone disconnects n from both networks: neither its peers nor any
// client reach it, as when a zone's uplink fails.
func (c *cluster) cutZone(n *node) time.Time {
	c.t.Helper()
	at := c.isolate(n)
	if _, err := docker(context.Background(), "", nil, "network", "disconnect", c.clntNet, n.container); err != nil {
		c.t.Fatal(err)
	}
	n.mu.Lock()
	n.cutClients = true
	n.mu.Unlock()
	return at
}

// healZone reconnects both networks; docker publishes new host ports.
func (c *cluster) healZone(n *node) time.Time {
	c.t.Helper()
	at := c.rejoin(n)
	if _, err := docker(context.Background(), "", nil, "network", "connect", "--ip", n.clientIP, c.clntNet, n.container); err != nil {
		c.t.Fatal(err)
	}
	c.discoverPorts(c.t, n)
	n.mu.Lock()
	n.cutClients = false
	n.mu.Unlock()
	return at
}

// ---------------------------------------------------------------------------
// Talking to the nodes.

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

func (c *cluster) byAdv(addr string) *node {
	for _, n := range c.nodes {
		if n.grpcAdv == addr {
			return n
		}
	}
	return nil
}

// Conn implements checker.Cluster: advertised (peers network) addresses are
// translated to the node's published port on the host.
func (c *cluster) Conn(addr string) *grpc.ClientConn {
	host := addr
	if n := c.byAdv(addr); n != nil {
		host, _ = n.hosts()
	}
	c.connMu.Lock()
	defer c.connMu.Unlock()
	cc := c.conns[host]
	if cc == nil {
		var err error
		if cc, err = grpc.NewClient(host, dialOptions()...); err != nil {
			// Only a malformed target fails here: a harness bug.
			panic(fmt.Sprintf("dial %s (%s): %v", host, addr, err))
		}
		c.conns[host] = cc
	}
	return cc
}

// Describe implements checker.Cluster.
func (c *cluster) Describe() string {
	var b strings.Builder
	ngs := c.nodeGroups()
	for g := range groups {
		id := "-"
		for n, ng := range ngs {
			if gs := groupState(ng, g); gs != nil && gs.RaftState == "Leader" {
				id = n.id
			}
		}
		fmt.Fprintf(&b, "g%d:%s ", g, id)
	}
	return strings.TrimSpace(b.String())
}

func (c *cluster) advAddrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.grpcAdv)
	}
	return out
}

func adminCtx(parent context.Context) (context.Context, context.CancelFunc) {
	ctx := metadata.AppendToOutgoingContext(parent, "authorization", "Bearer "+adminToken)
	return context.WithTimeout(ctx, adminCallTO)
}

func (c *cluster) admin(n *node) api.AdminClient { return api.NewAdminClient(c.Conn(n.grpcAdv)) }

// nodeGroups asks every reachable node for its raft state, in parallel.
func (c *cluster) nodeGroups() map[*node]*api.NodeGroupsResponse {
	out := map[*node]*api.NodeGroupsResponse{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if !n.reachable() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := adminCtx(context.Background())
			defer cancel()
			if resp, err := c.admin(n).NodeGroups(ctx, &api.NodeGroupsRequest{}); err == nil {
				mu.Lock()
				out[n] = resp
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
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

// leaderOf returns the node that reports itself leader of g with the highest
// term (a cut-off leader may still think it leads), or nil.
func (c *cluster) leaderOf(g int, ngs map[*node]*api.NodeGroupsResponse) (*node, uint64) {
	var best *node
	var term uint64
	for n, ng := range ngs {
		if gs := groupState(ng, g); gs != nil && gs.RaftState == "Leader" && (best == nil || gs.Term > term) {
			best, term = n, gs.Term
		}
	}
	return best, term
}

// leads lists the groups n's raft calls itself leader of.
func leads(ng *api.NodeGroupsResponse) []int {
	var out []int
	if ng == nil {
		return out
	}
	for _, gs := range ng.Groups {
		if gs.RaftState == "Leader" {
			out = append(out, int(gs.Group))
		}
	}
	sort.Ints(out)
	return out
}

// waitReady waits until each node's /readyz answers 200.
func (c *cluster) waitReady(ns ...*node) {
	c.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for _, n := range ns {
		for {
			_, h := n.hosts()
			resp, err := client.Get("http://" + h + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s not ready after %v (last: %v)", n.id, readyTimeout, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// health says what keeps the cluster from being healthy ("" = healthy): every
// node answers, every group has exactly one leader that every node follows,
// and that leader's configuration has 3 voters.
func (c *cluster) health() string {
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
			switch {
			case gs == nil:
				return fmt.Sprintf("%s reports nothing for group %d", n.id, g)
			case gs.RaftState == "Leader":
				if leader != nil {
					return fmt.Sprintf("group %d: two leaders (%s, %s)", g, leader.id, n.id)
				}
				leader = n
			case gs.RaftState != "Follower":
				return fmt.Sprintf("group %d: %s is %s", g, n.id, gs.RaftState)
			}
		}
		if leader == nil {
			return fmt.Sprintf("group %d has no leader", g)
		}
		for _, n := range c.nodes {
			if gs := groupState(ngs[n], g); gs.LeaderId != leader.id {
				return fmt.Sprintf("group %d: %s follows %q, not %s", g, n.id, gs.LeaderId, leader.id)
			}
		}
		ctx, cancel := adminCtx(context.Background())
		resp, err := c.admin(leader).ListPeers(ctx, &api.ListPeersRequest{Group: uint32(g)})
		cancel()
		if err != nil {
			return fmt.Sprintf("group %d: ListPeers on %s: %v", g, leader.id, err)
		}
		nv := 0
		for _, p := range resp.Peers {
			if p.Suffrage == "Voter" {
				nv++
			}
		}
		if nv != 3 {
			return fmt.Sprintf("group %d: %d voters, want 3", g, nv)
		}
	}
	return ""
}

// waitHealthy waits until health() is "" and returns how long that took.
func (c *cluster) waitHealthy() time.Duration {
	c.t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < healthyTimeout {
		if last = c.health(); last == "" {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("cluster not healthy after %v (hang?): %s", healthyTimeout, last)
	return 0
}

// watchStepDown polls the cut-off node n from `since` on and delivers how long
// it took until n no longer called itself leader of any group (-1: not
// within stepDownTimeout). It polls in the background so that the figure
// does not wait for whatever the test waits for meanwhile.
func (c *cluster) watchStepDown(n *node, since time.Time) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		for time.Since(since) < stepDownTimeout {
			ctx, cancel := adminCtx(context.Background())
			ng, err := c.admin(n).NodeGroups(ctx, &api.NodeGroupsRequest{})
			cancel()
			if err == nil && len(leads(ng)) == 0 {
				out <- time.Since(since)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		out <- -1
	}()
	return out
}

// checkNoCrashes fails the test if a container stopped or restarted.
func (c *cluster) checkNoCrashes() {
	c.t.Helper()
	for _, n := range c.nodes {
		out, err := docker(context.Background(), "", nil, "inspect", "-f", "{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}}", n.container)
		if err != nil {
			c.t.Errorf("%s: %v", n.id, err)
			continue
		}
		if out != "running 0 0" {
			c.t.Errorf("%s: container state %q, want running without restarts", n.id, out)
		}
	}
}

// ---------------------------------------------------------------------------
// The checker, bound to a cluster.

type ckr struct {
	*checker.Checker
	c *cluster
}

// checkerConfig: the fault tests' load with short per-attempt timeouts, so
// that recovery times are not rounded up to a timeout, and two writers per
// group, so that a writer stuck on a cut-off node delays only its own group
// (the per-group write gaps are then the cluster's, not the checker's).
func checkerConfig() checker.Config {
	cfg := checker.DefaultConfig()
	cfg.ReqTimeout = time.Second
	cfg.MaxBackoff = 20 * time.Millisecond
	cfg.Writers = 2 * groups
	cfg.PinGroups = true
	// The compose nodes run the default share mode, movable: (b) is checked
	// per tenant (StaticShares false), as operators deploy it.
	return cfg
}

// startChecker starts the checker with every attempt recorded (see
// recordHistory); finish checks the history.
func startChecker(t *testing.T, c *cluster, cfg checker.Config) *ckr {
	t.Helper()
	if cfg.History == nil {
		cfg.History = c.recordHistory()
	}
	return &ckr{Checker: checker.Start(t, c, c.advAddrs(), cfg), c: c}
}

// recordHistory starts a history file, <project>-history.jsonl, in
// $TOLLGATE_NETPART_LOGDIR beside the saved node logs, or else in a
// temporary directory that is removed when the test passes and kept (and
// named in the log) when it fails, with the check's history.html.
func (c *cluster) recordHistory() *history.Recorder {
	c.t.Helper()
	dir := os.Getenv("TOLLGATE_NETPART_LOGDIR")
	if dir == "" {
		d, err := os.MkdirTemp("", "tollgate-netpart-history-")
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() {
			if c.t.Failed() {
				c.t.Logf("history kept in %s", d)
				return
			}
			_ = os.RemoveAll(d)
		})
		dir = d
	}
	h, err := history.Create(filepath.Join(dir, c.project+"-history.jsonl"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = h.Close() }) // idempotent; finish closes it first
	return h
}

// finish stops the writers, waits for a healthy cluster, re-sends every
// acknowledged series (each must be accepted), asserts 0 violations and
// checks the history for linearizability (a violation fails the test and
// writes history.html beside the history).
func (ck *ckr) finish() {
	ck.c.t.Helper()
	ck.Stop()
	ck.c.waitHealthy()
	ck.Sweep()
	ck.Report()
	if h := ck.Config().History; h != nil {
		start := time.Now()
		if err := ck.CheckHistory(strings.TrimSuffix(h.Path(), ".jsonl")+".html", 2*time.Minute); err != nil {
			ck.c.t.Error(err)
		}
		ck.c.t.Logf("history: %d operations checked for linearizability in %v", len(h.Ops()), time.Since(start).Round(time.Millisecond))
	}
	ck.c.checkNoCrashes()
}

// logGaps logs, per group, the longest time without an acknowledged write
// between from and to.
func (ck *ckr) logGaps(what string, from, to time.Time) {
	var parts []string
	for g := range groups {
		gap, at := ck.MaxGap(g, from, to)
		parts = append(parts, fmt.Sprintf("g%d %.2f s (ended +%.2f s)", g, gap.Seconds(), at.Sub(from).Seconds()))
	}
	ck.c.t.Logf("longest write gap per group %s (%.1f s window): %s", what, to.Sub(from).Seconds(), strings.Join(parts, ", "))
}
