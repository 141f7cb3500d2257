package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/access"
	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
	"github.com/tollgate-io/tollgate/membership"
	"github.com/tollgate-io/tollgate/nodeport"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/recovery"
)

// capture is a rogue's gRPC listener: it records the metadata of every call
// that reaches it and answers like a node would where it can (Clock.Now with
// a made-up proof, Admin.NodeGroups naming itself), so nothing but the
// credentials decides whether the cluster takes it for a node.
type capture struct {
	mu       sync.Mutex
	calls    []string
	md       []metadata.MD
	id, raft string
}

func startCapture(t *testing.T, id string) (*capture, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{id: id}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		m, _ := grpc.MethodFromServerStream(ss)
		md, _ := metadata.FromIncomingContext(ss.Context())
		c.mu.Lock()
		c.calls, c.md = append(c.calls, m), append(c.md, md)
		c.mu.Unlock()
		switch m {
		case api.Clock_Now_FullMethodName:
			if err := ss.RecvMsg(&api.ClockNowRequest{}); err != nil {
				return err
			}
			_ = ss.SetHeader(metadata.Pairs(nodeport.ProofKey, id+" "+strings.Repeat("00", 32)))
			return ss.SendMsg(&api.ClockNowResponse{UnixNano: time.Now().UnixNano()})
		case api.Admin_NodeGroups_FullMethodName:
			if err := ss.RecvMsg(&api.NodeGroupsRequest{}); err != nil {
				return err
			}
			return ss.SendMsg(&api.NodeGroupsResponse{NodeId: id, RaftAddr: c.raft})
		}
		return status.Error(codes.Unimplemented, "capture")
	}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return c, lis.Addr().String()
}

// leaked lists every credential-like thing the capture received.
func (c *capture) leaked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i, md := range c.md {
		for k, vs := range md {
			switch k {
			case "authorization", nodeport.NodeAuthKey, forward.CallerKey:
				out = append(out, fmt.Sprintf("%s: %s=%v", c.calls[i], k, vs))
				continue
			}
			for _, v := range vs {
				if strings.Contains(strings.ToLower(v), "bearer") || strings.Contains(v, testToken) {
					out = append(out, fmt.Sprintf("%s: %s=%v", c.calls[i], k, vs))
				}
			}
		}
	}
	return out
}

func (c *capture) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// startRogue joins a process with no credential to the gossip at seed,
// advertising the capture's gRPC address and a raft address that accepts
// connections (and reads nothing), in the zone that has no voter.
func startRogue(t *testing.T, seed string) (*capture, error) {
	t.Helper()
	c, grpcAddr := startCapture(t, "rogue")
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	go func() {
		for {
			conn, err := rl.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	inc := make([]byte, 8)
	_, _ = rand.Read(inc)
	c.raft = raftnode.WithIncarnation(rl.Addr().String(), hex.EncodeToString(inc))
	m, err := membership.New(membership.Config{NodeID: "rogue", Zone: "zone-c", GRPCAddr: grpcAddr,
		RaftAddr: c.raft, BindAddr: "127.0.0.1:0", ProbeInterval: 200 * time.Millisecond,
		Incarnation: hex.EncodeToString(inc), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	_, err = m.Join([]string{seed})
	return c, err
}

// TestRogueJoinerGetsNothing: a process with no credential that joins the
// gossip of a cluster with an admin token, and advertises a gRPC listener,
// receives no credential of any kind (no admin token, no node credential,
// no forwarded caller), never becomes a learner or voter of any group
// although its zone has no voter, and is not shown to clients. In a
// plaintext cluster (--insecure-cluster) it joins gossip; in a cluster with a
// gossip key it cannot even join. Before node credentials the plaintext
// cluster sent it "Bearer <admin token>" within a second.
func TestRogueJoinerGetsNothing(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		name := "plaintext-insecure"
		if keyed {
			name = "gossip-key"
		}
		t.Run(name, func(t *testing.T) {
			tc := startCluster(t, 2, func(i int, c *Config) {
				c.Cluster.Replicas = 3 // zone-c has no voter: a joiner there is placed at once
				if !keyed {
					c.Access.TLS.GossipKeys, c.Access.InsecureCluster = nil, true
				}
			})
			cp, err := startRogue(t, tc.nodes[0].GossipAddr())
			if keyed {
				if err == nil {
					t.Fatal("a process without the gossip key joined the gossip")
				}
			} else {
				if err != nil {
					t.Fatalf("rogue join: %v", err)
				}
				waitFor(t, "the rogue alive in the nodes' gossip", func() bool {
					for _, s := range tc.nodes {
						if !slices.ContainsFunc(s.members.Members(), func(m membership.Member) bool {
							return m.ID == "rogue" && m.Status == membership.StatusAlive
						}) {
							return false
						}
					}
					return true
				})
			}
			// Bounded window: leaders reconcile on every member change and
			// every 2 s, clocks are polled every second. The bar is
			// 5 minutes: TOLLGATE_ROGUE_WINDOW=5m watches that long.
			window := 8 * time.Second
			if v := os.Getenv("TOLLGATE_ROGUE_WINDOW"); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					t.Fatalf("TOLLGATE_ROGUE_WINDOW=%q: want a positive duration such as 5m", v)
				}
				window = d
			}
			deadline := time.Now().Add(window)
			for time.Now().Before(deadline) {
				if l := cp.leaked(); len(l) > 0 {
					t.Fatalf("the rogue received credentials: %v", l)
				}
				for _, s := range tc.nodes {
					for g := range s.cfg.Layout.Groups {
						fut := s.Raft(g).GetConfiguration()
						if fut.Error() != nil {
							continue
						}
						for _, srv := range fut.Configuration().Servers {
							if srv.ID == "rogue" {
								t.Fatalf("group %d: the rogue was added to the configuration (%s)", g, srv.Suffrage)
							}
						}
					}
					if slices.ContainsFunc(s.memberList(), func(m membership.Member) bool { return m.ID == "rogue" }) {
						t.Fatalf("%s counts the rogue as a member", s.cfg.Node.ID)
					}
					if v, _ := s.view.get(); v != nil && slices.ContainsFunc(v.Members, func(m *api.Member) bool { return m.Id == "rogue" }) {
						t.Fatalf("%s shows the rogue to clients", s.cfg.Node.ID)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !keyed && cp.count() == 0 {
				t.Fatal("the rogue was never even challenged: the test did not exercise the node's calls")
			}
			t.Logf("%d calls reached the rogue in %v, none with a credential", cp.count(), window)
		})
	}
}

// v2Header is the 23-byte raft connection header of earlier builds: group,
// cluster id, incarnation, no authentication.
func v2Header(group int, cluster, inc string) []byte {
	h := []byte("TGRF\x02\x00\x00")
	binary.BigEndian.PutUint16(h[5:], uint16(group))
	c, _ := hex.DecodeString(cluster)
	i, _ := hex.DecodeString(inc)
	h = append(h, make([]byte, 16)...)
	copy(h[7:15], c)
	copy(h[15:23], i)
	return h
}

// v3Header is an authenticated header (raftnode/mux.go) under key.
func v3Header(group int, cluster, inc string, key []byte) []byte {
	h := v2Header(group, cluster, inc)
	h[4] = 3
	h = binary.BigEndian.AppendUint64(h, uint64(time.Now().UnixMilli()))
	n := make([]byte, 16)
	_, _ = rand.Read(n)
	h = append(h, n...)
	m := hmac.New(sha256.New, key)
	m.Write(h)
	return m.Sum(h)
}

// acceptedRaft sends hdr to the raft port at addr and reports whether the
// node kept the connection (handed it to raft, where an RPC such as a vote
// request would be served) rather than closing it.
func acceptedRaft(t *testing.T, addr string, hdr []byte) bool {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(hdr); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestForgedRaftHeaders: with a cluster key the raft port hands nothing to
// raft without a valid header MAC: a stranger who knows a node's incarnation
// and cluster id (any track credential can read them) cannot reach raft to
// ask for a vote, with no key or another cluster's key, and floods of
// unauthenticated 23-byte headers naming other incarnations neither make the
// node unready nor tell the operator to remove it. A header made with the
// cluster's key is accepted (the control). Both a keyed cluster and a
// plaintext one started with --insecure-cluster (key from the admin token).
func TestForgedRaftHeaders(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		name := "gossip-key"
		if !keyed {
			name = "plaintext-insecure"
		}
		t.Run(name, func(t *testing.T) {
			tc := startCluster(t, 3, func(i int, c *Config) {
				if !keyed {
					c.Access.TLS.GossipKeys, c.Access.InsecureCluster = nil, true
				}
			})
			s := tc.nodes[1]
			ep, inc := raftnode.SplitIncarnation(s.RaftAddr())
			cid := s.ident.ClusterID()
			if inc == "" || cid == "" {
				t.Fatalf("node has no incarnation (%q) or cluster id (%q)", inc, cid)
			}
			other := make([]byte, 8)
			_, _ = rand.Read(other)
			if acceptedRaft(t, ep, v2Header(0, cid, inc)) {
				t.Fatal("an unauthenticated header naming the node's incarnation reached raft (forged votes possible)")
			}
			if acceptedRaft(t, ep, v3Header(0, cid, inc, []byte("not the cluster's key, 32 bytes!"))) {
				t.Fatal("a header under another key reached raft")
			}
			key := clusterKeys(s.cfg, "raft")[0]
			good := v3Header(0, cid, inc, key)
			if !acceptedRaft(t, ep, good) {
				t.Fatal("a header under the cluster key was refused: the check above proves nothing")
			}
			if acceptedRaft(t, ep, good) {
				t.Fatal("a replayed header reached raft")
			}
			// The flood of the issue: 23 bytes naming another incarnation,
			// every 100 ms, and variants naming no incarnation or another
			// cluster.
			for i := range 30 {
				var h []byte
				switch i % 3 {
				case 0:
					h = v2Header(i%s.cfg.Layout.Groups, cid, hex.EncodeToString(other))
				case 1:
					h = v2Header(i%s.cfg.Layout.Groups, hex.EncodeToString(other), inc)
				default:
					h = v2Header(i%s.cfg.Layout.Groups, "", "")
				}
				c, err := net.Dial("tcp", ep)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = c.Write(h)
				_, _ = io.Copy(io.Discard, c)
				c.Close()
				if why := s.NotReadyReason(); why != "" {
					t.Fatalf("after %d forged headers the node is not ready: %s", i+1, why)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if why := s.identityReason(); why != "" {
				t.Fatalf("forged headers reach the operator: %s", why)
			}
		})
	}
}

// TestInsecureClusterRefusedToStart: a multi-node node with credentials and
// neither a gossip key nor TLS does not start unless --insecure-cluster says
// so, and the error names the fix; a single --dev node, a node without
// credentials, one with a gossip key and one with the flag start.
func TestInsecureClusterRefusedToStart(t *testing.T) {
	base := func() Config {
		return Config{Node: NodeConfig{DataDir: t.TempDir(), ID: "n1"}, Gossip: GossipConfig{Addr: "127.0.0.1:0"}, Cluster: ClusterConfig{BootstrapExpect: 3}, Access: AccessConfig{AdminToken: testToken}}
	}
	c := base()
	err := c.Validate()
	if !errors.Is(err, access.ErrInsecureCluster) {
		t.Fatalf("credentials, gossip, no key, no TLS: %v, want the insecure-cluster refusal", err)
	}
	for _, want := range []string{"--gossip-keyring-file", "--insecure-cluster", "tollgate tls gossip-key", "docs/tls.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %s: %v", want, err)
		}
	}
	if _, err := New(base()); !errors.Is(err, access.ErrInsecureCluster) {
		t.Fatalf("New: %v", err)
	}
	creds := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(creds, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"credentials file": func(c *Config) { c.Access.CredentialsFile = creds },
		"joins, no bootstrap-expect": func(c *Config) {
			c.Cluster.BootstrapExpect, c.Gossip.Join = 0, []string{"127.0.0.1:1"}
		},
	} {
		c := base()
		mod(&c)
		if err := c.Validate(); !errors.Is(err, access.ErrInsecureCluster) {
			t.Errorf("%s: %v, want the refusal", name, err)
		}
	}
	for name, mod := range map[string]func(*Config){
		"gossip key":      func(c *Config) { c.Access.TLS.GossipKeys = testGossipKeys },
		"insecure flag":   func(c *Config) { c.Access.InsecureCluster = true },
		"no credentials":  func(c *Config) { c.Access.AdminToken = "" },
		"no gossip":       func(c *Config) { c.Gossip.Addr, c.Cluster.BootstrapExpect, c.Cluster.Bootstrap = "", 0, true },
		"single dev node": func(c *Config) { c.Cluster.BootstrapExpect, c.Cluster.Bootstrap = 0, true },
	} {
		c := base()
		mod(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v, want it to start", name, err)
		}
	}
}

// TestRecoverRefusesAnotherNodesID: raft recover on a node's data dir with
// the id of another node of its groups refuses, naming the data dir's own
// id (it used to plan, report RECOVERED and leave the replica down).
func TestRecoverRefusesAnotherNodesID(t *testing.T) {
	tc := startCluster(t, 3, nil)
	dir := tc.dirs[0]
	for i, s := range tc.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = s.Stop(ctx)
		cancel()
		tc.nodes[i] = nil
	}
	_, err := recovery.Prepare(recovery.Options{DataDir: dir, NodeID: "n2", Voters: []string{"n2"}})
	if err == nil || !strings.Contains(err.Error(), `belongs to node "n1", not "n2"`) {
		t.Fatalf("recover n1's data dir as n2: %v, want a refusal naming n1", err)
	}
	p, err := recovery.Prepare(recovery.Options{DataDir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatalf("recover with the data dir's own id: %v", err)
	}
	_ = p.Close()
}

// TestForwardedCallerScope: a call forwarded by a node carries the caller's
// principal under the node credential, and the node that answers applies
// that caller's scope and tenants, never the forwarding node's rights; only
// a node may name a forwarded caller, and a node credential is good once.
func TestForwardedCallerScope(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "creds")
	line := func(name, tok, scopes, tenants string) string {
		h := sha256.Sum256([]byte(tok))
		return fmt.Sprintf("%s sha256:%s %s %s\n", name, hex.EncodeToString(h[:]), scopes, tenants)
	}
	if err := os.WriteFile(creds, []byte(line("reader", "reader-token", "read", "")+line("dist-a", "dist-a-token", "track", "tenant-a")), 0o600); err != nil {
		t.Fatal(err)
	}
	tc := startCluster(t, 3, func(i int, c *Config) { c.Access.CredentialsFile = creds })
	target := tc.nodes[1]
	addr := target.GRPCAddr()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	keys := nodeport.NewKeys("n1", clusterKeys(tc.nodes[0].cfg, "grpc"))
	as := func(method, caller string) context.Context {
		md := metadata.Pairs(forward.Header, "1", nodeport.NodeAuthKey, keys.Sign(target.grpcAdvertise(), method, caller))
		if caller != "" {
			md.Set(forward.CallerKey, caller)
		}
		return metadata.NewOutgoingContext(context.Background(), md)
	}
	status_ := func(ctx context.Context) codes.Code {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := api.NewAdminClient(cc).NodeGroups(ctx, &api.NodeGroupsRequest{})
		return status.Code(err)
	}
	m := api.Admin_NodeGroups_FullMethodName
	for _, c := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"forwarded for a read credential", as(m, "cred:reader"), codes.PermissionDenied},
		{"forwarded for an anonymous caller", as(m, forward.CallerAnonymous), codes.Unauthenticated},
		{"forwarded for an unknown credential", as(m, "cred:nobody"), codes.Unauthenticated},
		{"forwarded for the admin token", as(m, forward.CallerAdminToken), codes.OK},
		{"the node's own call", as(m, ""), codes.OK},
		{"a client naming a caller", metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer reader-token", forward.CallerKey, forward.CallerAdminToken)), codes.Unauthenticated},
		{"a credential for another method", as(api.Admin_Status_FullMethodName, ""), codes.Unauthenticated},
	} {
		if got := status_(c.ctx); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// Tenants: a track credential limited to tenant-a, forwarded, tracks
	// tenant-a and not tenant-b.
	track := func(tenant string) codes.Code {
		ctx := as(api.Tracker_TrackSeries_FullMethodName, "cred:dist-a")
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := api.NewTrackerClient(cc).TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: tenant})
		return status.Code(err)
	}
	if got := track("tenant-b"); got != codes.PermissionDenied {
		t.Errorf("forwarded for dist-a on tenant-b: %v, want PermissionDenied", got)
	}
	if got := track("tenant-a"); got != codes.OK {
		t.Errorf("forwarded for dist-a on tenant-a: %v, want OK", got)
	}
	// Replay: the same credential twice.
	ctx := as(m, "")
	if got := status_(ctx); got != codes.OK {
		t.Fatalf("first use: %v", got)
	}
	if got := status_(ctx); got != codes.Unauthenticated {
		t.Errorf("replayed node credential: %v, want Unauthenticated", got)
	}
}
