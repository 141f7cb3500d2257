package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// testPKI is a development PKI (tlsutil.InitDev) for nodes n1..n5.
func testPKI(t *testing.T) tlsutil.DevFiles {
	t.Helper()
	f, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: t.TempDir(), Nodes: []string{"n1", "n2", "n3", "n4", "n5"}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// nodeTLS is what `tollgate server` builds from --tls-* flags: one node
// certificate for gRPC, HTTP, forwarding and raft, client auth as given.
func nodeTLS(t *testing.T, f tlsutil.DevFiles, node, clientAuth string) TLSConfig {
	t.Helper()
	cert, key := f.Nodes[node][0], f.Nodes[node][1]
	srv, err := tlsutil.ServerConfig(cert, key, f.CA, clientAuth)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := tlsutil.ClientConfig(cert, key, f.CA, "")
	if err != nil {
		t.Fatal(err)
	}
	rs, rc, err := tlsutil.PeerConfigs(cert, key, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := tlsutil.ReadGossipKeyring(f.GossipKey)
	if err != nil {
		t.Fatal(err)
	}
	return TLSConfig{GRPC: srv, HTTP: srv, Peer: peer, RaftServer: rs, RaftClient: rc, GossipKeys: keys}
}

func tlsDial(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func clientTLS(t *testing.T, cert, key, ca string) *tls.Config {
	t.Helper()
	c, err := tlsutil.ClientConfig(cert, key, ca, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTLSClientAuthAndAdminToken: with --tls-client-auth require, only clients
// holding a certificate of the cluster's CA get an answer; the admin token is
// still required on top of TLS; HTTP serves /readyz over TLS only.
func TestTLSClientAuthAndAdminToken(t *testing.T) {
	f, other := testPKI(t), testPKI(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.TLS = nodeTLS(t, f, "n1", tlsutil.ClientAuthRequire)
		c.Access.AdminToken = testToken
	})
	defer stop(t, s)
	hs := hashesIn(1, 0, 3)
	req := &api.TrackSeriesRequest{Tenant: "t", Partition: 0, Hashes: hs}
	call := func(cfg *tls.Config) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A certificate says which machine connects, the token what it may do.
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
		_, err := api.NewTrackerClient(tlsDial(t, s.GRPCAddr(), cfg)).TrackSeries(ctx, req)
		return err
	}
	if err := call(clientTLS(t, f.Client, f.ClientKey, f.CA)); err != nil {
		t.Fatalf("client with a valid certificate: %v", err)
	}
	refused := map[string]*tls.Config{
		"no client certificate":        clientTLS(t, "", "", f.CA),
		"certificate from another CA":  clientTLS(t, other.Client, other.ClientKey, f.CA),
		"client trusting another CA":   clientTLS(t, f.Client, f.ClientKey, other.CA),
		"plaintext client":             nil,
		"node certificate of other CA": clientTLS(t, other.Nodes["n1"][0], other.Nodes["n1"][1], f.CA),
	}
	for name, cfg := range refused {
		err := call(cfg)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (connection refused by TLS)", name, err)
		}
	}

	// The admin token still applies over mutual TLS.
	adm := api.NewAdminClient(tlsDial(t, s.GRPCAddr(), clientTLS(t, f.Client, f.ClientKey, f.CA)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := adm.NodeGroups(ctx, &api.NodeGroupsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("admin over TLS without token: %v, want Unauthenticated", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer wrong")
	if _, err := adm.NodeGroups(bad, &api.NodeGroupsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("admin over TLS with a wrong token: %v, want Unauthenticated", err)
	}
	good := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
	if _, err := adm.NodeGroups(good, &api.NodeGroupsRequest{}); err != nil {
		t.Fatalf("admin over TLS with the token: %v", err)
	}

	// HTTP over TLS.
	if s.HTTPScheme() != "https" {
		t.Fatalf("scheme %q", s.HTTPScheme())
	}
	get := func(cfg *tls.Config, scheme string) (int, string, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(scheme + "://" + s.HTTPAddr() + "/readyz")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := get(clientTLS(t, f.Client, f.ClientKey, f.CA), "https"); err != nil || code != 200 || !strings.Contains(body, "ready") {
		t.Fatalf("https /readyz: %d %q %v", code, body, err)
	}
	if _, _, err := get(clientTLS(t, "", "", f.CA), "https"); err == nil {
		t.Fatal("https /readyz without a client certificate answered under require")
	}
	if code, _, err := get(nil, "http"); err == nil && code == 200 {
		t.Fatal("plain http /readyz answered 200 on a TLS listener")
	}
}

// TestTLSHTTPWithoutClientAuth: an HTTP listener with client auth "none"
// (dashboards, scrapers holding only the CA) serves any TLS client.
func TestTLSHTTPWithoutClientAuth(t *testing.T) {
	f := testPKI(t)
	s, _ := startServer(t, t.TempDir(), func(c *Config) {
		c.Access.TLS = nodeTLS(t, f, "n1", tlsutil.ClientAuthRequire)
		var err error
		if c.Access.TLS.HTTP, err = tlsutil.ServerConfig(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA, tlsutil.ClientAuthNone); err != nil {
			t.Fatal(err)
		}
	})
	defer stop(t, s)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(t, "", "", f.CA)}}
	resp, err := c.Get("https://" + s.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/readyz: %d", resp.StatusCode)
	}
}

// syncBuffer collects a node's logs for assertions.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.b.String(), s)
}

// TestTLSClusterRejectsRaftPeerOfAnotherCA runs a three-node cluster with TLS on
// every channel (gRPC with required client certificates, raft mTLS, encrypted
// gossip), checks that admin calls are forwarded between nodes over TLS, then
// adds two voters to group 0 the same way: one with a certificate of the
// cluster's CA, which catches up, and one whose certificate another CA signed,
// which never receives a byte of the group's log.
func TestTLSClusterRejectsRaftPeerOfAnotherCA(t *testing.T) {
	f, other := testPKI(t), testPKI(t)
	tc := startCluster(t, 3, func(i int, c *Config) {
		c.Access.TLS = nodeTLS(t, f, fmt.Sprintf("n%d", i+1), tlsutil.ClientAuthRequire)
		c.Cluster.LeaderBalanceInterval = -1
		c.Cluster.DisableAutoPlace = true
	})
	ctx := adminCtx(t)
	client := clientTLS(t, f.Client, f.ClientKey, f.CA)

	// Forwarding: ask a node that does not lead group 0.
	l0 := tc.leader(0)
	var follower *Server
	for _, s := range tc.nodes {
		if s != l0 {
			follower = s
		}
	}
	adm := api.NewAdminClient(tlsDial(t, follower.GRPCAddr(), client))
	if lp, err := adm.ListPeers(ctx, &api.ListPeersRequest{Group: 0}); err != nil || len(lp.Peers) != 3 {
		t.Fatalf("list peers through a follower (forwarded over TLS): %v %v", lp, err)
	}
	if _, err := api.NewTrackerClient(tlsDial(t, follower.GRPCAddr(), client)).TrackSeries(ctx,
		&api.TrackSeriesRequest{Tenant: "t", Partition: 0, Hashes: hashesIn(3, 0, 10)}); err != nil {
		// A non-leader answers NotLeader; anything else means TLS failed.
		if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition {
			t.Fatalf("track through a follower: %v", err)
		}
	}
	trackOnLeader(ctx, t, tc, client, 4) // some log to replicate

	// Metering forwards each event to its target group's leader over the
	// node's peer connections: with 4 groups on 3 nodes, some of these 12
	// starts are forwarded, and every one must succeed over TLS.
	now := time.Now().UnixMilli()
	for i, n := range tc.nodes {
		mc := api.NewMeteringClient(tlsDial(t, n.GRPCAddr(), client))
		for j := range 4 {
			inst := fmt.Sprintf("tls-%d-%d", i, j)
			var err error
			for range 20 { // retried while leadership moves
				_, err = mc.Start(ctx, &api.MeterEvent{Id: inst, Timestamp: now, Target: &api.MeterTarget{
					OrganizationId: "o", SpaceId: "s", ConsumerId: "c", ResourceId: "r", PlanId: "p", ResourceInstanceId: inst},
					MeasuredUsage: []*api.MeterMeasure{{Measure: "memory", Quantity: 1}}})
				if status.Code(err) != codes.Unavailable {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("metering start %s through %s (forwarded over TLS when it does not lead the group): %v", inst, n.cfg.Node.ID, err)
			}
		}
	}

	// Both extra nodes join the gossip (the leader checks a new server's log
	// through its member entry before promoting it), with the cluster's
	// gossip key.
	extra := func(node string, tlsc TLSConfig, logs io.Writer) *Server {
		tlsc.GossipKeys = tc.nodes[0].cfg.Access.TLS.GossipKeys
		s, err := New(Config{
			Node: NodeConfig{
				ID:       node,
				Zone:     "zone-x",
				DataDir:  t.TempDir(),
				GRPCAddr: "127.0.0.1:0",
				HTTPAddr: "-",
			},
			Raft:   RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
			Access: AccessConfig{AdminToken: testToken, TLS: tlsc},
			Gossip: GossipConfig{
				Addr:          "127.0.0.1:0",
				ProbeInterval: 200 * time.Millisecond,
				Join:          []string{tc.nodes[0].GossipAddr()},
			},
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = s.Stop(sctx)
		})
		return s
	}
	// Through any node (forwarded to the leader), retried while leadership
	// moves: on a loaded machine a group may change leader under the call.
	anyAdm := api.NewAdminClient(tlsDial(t, follower.GRPCAddr(), client))
	addVoter := func(id, addr string) {
		t.Helper()
		var err error
		for range 20 {
			if _, err = anyAdm.AddVoter(ctx, &api.AddVoterRequest{Group: 0, Id: id, Address: addr}); err == nil {
				return
			}
			if c := status.Code(err); c != codes.Unavailable && c != codes.FailedPrecondition {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("add %s: %v", id, err)
	}

	// Control: a node of the same CA joins group 0 and catches up.
	good := extra("n4", nodeTLS(t, f, "n4", tlsutil.ClientAuthRequire), io.Discard)
	addVoter("n4", good.RaftAddr())
	want := tc.leader(0).Raft(0).CommitIndex()
	waitFor(t, "n4 to catch up on group 0", func() bool { return good.Raft(0).AppliedIndex() >= want })

	// A node whose certificates another CA signed (same node name, so its
	// certificate is otherwise valid for the address) cannot join.
	var rogueLogs syncBuffer
	rogue := extra("n5", nodeTLS(t, other, "n5", tlsutil.ClientAuthRequire), &rogueLogs)
	// add-voter refuses it before any change: its raft port fails the TLS
	// handshake, so it does not answer raft.
	var err error
	for range 20 {
		_, err = anyAdm.AddVoter(ctx, &api.AddVoterRequest{Group: 0, Id: "n5", Address: rogue.RaftAddr()})
		if status.Code(err) != codes.Unavailable {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not answer raft") {
		t.Fatalf("add-voter of the rogue node: %v, want FailedPrecondition: does not answer raft", err)
	}
	// The transport refuses it too: made a non-voter by raft directly (no
	// quorum at stake), it never receives the log.
	for range 20 {
		if err = tc.leader(0).Raft(0).AddNonvoter("n5", raft.ServerAddress(rogue.RaftAddr()), 0, 10*time.Second).Error(); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("add n5 as a non-voter: %v", err)
	}
	waitFor(t, "the leader's connections to the rogue node to fail the TLS handshake", func() bool {
		return rogueLogs.count("tls handshake failed") >= 3
	})
	if n := rogue.Raft(0).LastIndex(); n != 0 {
		t.Fatalf("rogue node holds group 0's log up to index %d", n)
	}
	if addr, id := rogue.Raft(0).LeaderWithID(); addr != "" || id != "" {
		t.Fatalf("rogue node knows group 0's leader %s (%s)", id, addr)
	}
	if rogue.Raft(0).State() == raft.Leader {
		t.Fatal("rogue node leads group 0")
	}
	// The cluster is unharmed: group 0 still commits.
	trackOnLeader(ctx, t, tc, client, 5)
}

// trackOnLeader tracks 50 series of partition 0 on group 0's current leader,
// retrying while leadership moves.
func trackOnLeader(ctx context.Context, t *testing.T, tc *testCluster, client *tls.Config, seed uint64) {
	t.Helper()
	var err error
	for range 20 {
		_, err = api.NewTrackerClient(tlsDial(t, tc.leader(0).GRPCAddr(), client)).TrackSeries(ctx,
			&api.TrackSeriesRequest{Tenant: "t", Partition: 0, Hashes: hashesIn(seed, 0, 50)})
		if c := status.Code(err); c != codes.Unavailable && c != codes.FailedPrecondition {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("track on group 0's leader: %v", err)
	}
}
