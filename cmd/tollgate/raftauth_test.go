package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/raftnode"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// tlsNode is one `tollgate server` process of a TLS cluster.
type tlsNode struct {
	id, grpc, raft, gossip, http string
	dir, logPath                 string
	cmd                          *exec.Cmd
	exited                       chan struct{}
}

// startTLSCluster runs three real server processes with the certificates of
// `tollgate tls init` (node certificates, gRPC requiring client certificates,
// mutual TLS on raft, encrypted gossip), forming a cluster with
// --bootstrap-expect 3, and returns once each printed its ready banner.
func startTLSCluster(t *testing.T, bin, certs, token string) []*tlsNode {
	t.Helper()
	for attempt := 1; ; attempt++ {
		nodes, err := startTLSClusterOnce(t, bin, certs, token)
		if err == nil {
			return nodes
		}
		// freePort closes the port it found before the node binds it:
		// with other suites running, another process can take it first.
		if attempt < 3 && errors.Is(err, errPortTaken) {
			t.Logf("attempt %d: %v; starting again on other ports", attempt, err)
			continue
		}
		t.Fatal(err)
	}
}

var errPortTaken = errors.New("a port was taken before the node bound it")

func startTLSClusterOnce(t *testing.T, bin, certs, token string) ([]*tlsNode, error) {
	t.Helper()
	base := t.TempDir()
	var nodes []*tlsNode
	for i := range 3 {
		id := fmt.Sprintf("node-%d", i+1)
		nodes = append(nodes, &tlsNode{id: id, grpc: freePort(t), raft: freePort(t), gossip: freePort(t), http: freePort(t),
			dir: filepath.Join(base, id), logPath: filepath.Join(base, id+".log")})
	}
	p := filepath.Join
	type readiness struct {
		i   int
		err error
	}
	readies := make(chan readiness, len(nodes))
	for i, n := range nodes {
		args := []string{"server", "--node-id", n.id, "--zone", fmt.Sprintf("zone-%c", 'a'+i), "--data-dir", n.dir,
			"--grpc-addr", n.grpc, "--raft-addr", n.raft, "--gossip-addr", n.gossip, "--http-addr", n.http,
			"--bootstrap-expect", "3", "--admin-token", token, "--log-level", "warn",
			"--tls-cert", p(certs, n.id+".pem"), "--tls-key", p(certs, n.id+"-key.pem"), "--tls-ca", p(certs, "ca.pem"),
			"--tls-client-auth", "require", "--gossip-keyring-file", p(certs, "gossip.key")}
		if i > 0 {
			args = append(args, "--join", nodes[0].gossip)
		}
		cmd := exec.Command(bin, args...)
		logf, err := os.Create(n.logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = logf
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		n.cmd, n.exited = cmd, make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stdout)
			seen := false
			for sc.Scan() {
				fmt.Fprintln(logf, sc.Text())
				if !seen && strings.Contains(sc.Text(), "ready") {
					seen = true
					readies <- readiness{i, nil}
				}
			}
			if !seen {
				readies <- readiness{i, fmt.Errorf("%s exited before it was ready (log %s)", n.id, n.logPath)}
			}
			_ = cmd.Wait()
			logf.Close()
			close(n.exited)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-n.exited
			if t.Failed() {
				b, _ := os.ReadFile(n.logPath)
				t.Logf("----- %s log -----\n%s", n.id, tailLines(string(b), 40))
			}
		})
	}
	killAll := func() {
		for _, n := range nodes {
			_ = n.cmd.Process.Signal(syscall.SIGKILL)
			<-n.exited
		}
	}
	deadline := time.After(120 * time.Second)
	for range nodes {
		select {
		case r := <-readies:
			if r.err != nil {
				// The log file is complete once the process exited.
				killAll()
				b, _ := os.ReadFile(nodes[r.i].logPath)
				if strings.Contains(string(b), "address already in use") {
					return nil, fmt.Errorf("%w: %s: %s", errPortTaken, nodes[r.i].id, strings.TrimSpace(tailLines(string(b), 1)))
				}
				return nil, r.err
			}
		case <-deadline:
			killAll()
			return nil, errors.New("the cluster was not ready after 120s")
		}
	}
	return nodes, nil
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// groupView is one node's view of one group.
type groupView struct {
	state, leader string
	term          uint64
}

// clusterView asks every node for its local raft state (NodeGroups over TLS
// with the client certificate and the admin token).
func clusterView(t *testing.T, nodes []*tlsNode, client *tls.Config, token string) (map[string][]groupView, error) {
	t.Helper()
	out := map[string][]groupView{}
	for _, n := range nodes {
		cc, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(credentials.NewTLS(client)))
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), 5*time.Second)
		resp, err := api.NewAdminClient(cc).NodeGroups(ctx, &api.NodeGroupsRequest{})
		cancel()
		cc.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: NodeGroups: %w", n.id, err)
		}
		for _, g := range resp.Groups {
			out[n.id] = append(out[n.id], groupView{state: g.RaftState, leader: g.LeaderId, term: g.Term})
		}
	}
	return out, nil
}

// incarnationAddrs replaces each node's raft address with the one its
// members gossip (host:port#incarnation), read from a node's Status.
func incarnationAddrs(t *testing.T, nodes []*tlsNode, client *tls.Config, token string) {
	t.Helper()
	cc, err := grpc.NewClient(nodes[0].grpc, grpc.WithTransportCredentials(credentials.NewTLS(client)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), 10*time.Second)
	defer cancel()
	st, err := api.NewAdminClient(cc).Status(ctx, &api.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, m := range st.GetView().GetMembers() {
			if m.Id == n.id {
				if ep, inc := raftnode.SplitIncarnation(m.RaftAddress); ep != n.raft || inc == "" {
					t.Fatalf("%s gossips raft address %q; want %s#<incarnation>", n.id, m.RaftAddress, n.raft)
				}
				n.raft = m.RaftAddress
			}
		}
	}
}

// settled: every group has exactly one leader that every node follows, in one term.
func settled(v map[string][]groupView, nodes []*tlsNode) string {
	for g := range v[nodes[0].id] {
		leaders := 0
		for _, n := range nodes {
			gv := v[n.id][g]
			if gv.state == "Leader" {
				leaders++
			}
			if gv.leader == "" || gv.leader != v[nodes[0].id][g].leader || gv.term != v[nodes[0].id][g].term {
				return fmt.Sprintf("group %d: nodes disagree: %v", g, v)
			}
		}
		if leaders != 1 {
			return fmt.Sprintf("group %d: %d leaders", g, leaders)
		}
	}
	return ""
}

// forger speaks raft to a node's raft port the way a node does (TLS, the
// Tollgate group header, hashicorp/raft's wire format), presenting whatever
// certificate its TLS configuration holds.
type forger struct {
	mux    *raftnode.Mux
	trans  map[int]*raft.NetworkTransport
	layers map[int]*raftnode.GroupLayer
}

// The forger holds the cluster key (it authenticates the raft connection
// header, raftnode/mux.go): what refuses it is then the certificate alone.
func newForger(t *testing.T, clientTLS *tls.Config, groups int, keys [][]byte) *forger {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the forger only dials
	if err != nil {
		t.Fatal(err)
	}
	mux, err := raftnode.NewMux(ln, raftnode.MuxConfig{ClientTLS: clientTLS, ClusterKeys: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f := &forger{mux: mux, trans: map[int]*raft.NetworkTransport{}, layers: map[int]*raftnode.GroupLayer{}}
	for g := range groups {
		l, err := mux.Register(g)
		if err != nil {
			t.Fatal(err)
		}
		f.layers[g] = l
		f.trans[g] = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: l, MaxPool: 1, Timeout: 5 * time.Second,
			Logger: nil})
	}
	t.Cleanup(func() {
		for _, tr := range f.trans {
			_ = tr.Close()
		}
		_ = mux.Close()
	})
	return f
}

// TestRaftPortRefusesClientCertificate is the attack on the raft port with
// the client certificate `tollgate tls init` hands to clients and the CLI: a
// RequestVote with term 1,000,000 posing as a node (leadership-transfer flag
// set, so a known leader does not stop the vote), a TimeoutNow and an
// AppendEntries posing as a leader, sent to every node for every group. Every
// RPC must fail at the TLS handshake, and afterwards every group keeps its
// term and its leader on every node.
func TestRaftPortRefusesClientCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	certs := t.TempDir()
	if out, err := exec.Command(bin, "tls", "init", "--dir", certs, "--nodes", "node-1,node-2,node-3").CombinedOutput(); err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	const token = "raft-attack-token"
	nodes := startTLSCluster(t, bin, certs, token)
	p := filepath.Join
	client, err := tlsutil.ClientConfig(p(certs, "client.pem"), p(certs, "client-key.pem"), p(certs, "ca.pem"), "")
	if err != nil {
		t.Fatal(err)
	}

	var before map[string][]groupView
	deadline := time.Now().Add(120 * time.Second)
	for {
		v, err := clusterView(t, nodes, client, token)
		why := ""
		if err != nil {
			why = err.Error()
		} else if why = settled(v, nodes); why == "" {
			before = v
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not settled after 120s: %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
	groups := len(before[nodes[0].id])
	t.Logf("before: %v", before)
	// Dial each node at the raft address its group configurations hold: the
	// endpoint plus its data dir's incarnation (a connection naming no
	// incarnation is refused by the identity check before any certificate
	// question, which would prove nothing here).
	incarnationAddrs(t, nodes, client, token)

	// Control: the same forger holding a node certificate reaches raft (an
	// AppendEntries of term 0 is answered and changes nothing), so the
	// refusals below are the certificate's doing.
	nodeCert, err := tlsutil.ClientConfig(p(certs, "node-3.pem"), p(certs, "node-3-key.pem"), p(certs, "ca.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	var ctl raft.AppendEntriesResponse
	gk, err := tlsutil.ReadGossipKeyring(p(certs, "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	keys := server.RaftClusterKeys(server.Config{Access: server.AccessConfig{AdminToken: token, TLS: server.TLSConfig{GossipKeys: gk}}})
	if err := newForger(t, nodeCert, groups, keys).trans[0].AppendEntries(raft.ServerID(nodes[0].id), raft.ServerAddress(nodes[0].raft),
		&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("node-3"), Addr: []byte(nodes[2].raft)}}, &ctl); err != nil {
		t.Fatalf("control: a node certificate cannot reach raft: %v", err)
	}
	if ctl.Success || ctl.Term != before[nodes[0].id][0].term {
		t.Fatalf("control: stale AppendEntries answered %+v", ctl)
	}

	f := newForger(t, client, groups, keys)
	const forgedTerm = 1_000_000
	var accepted []string
	var mu sync.Mutex
	note := func(format string, args ...any) {
		mu.Lock()
		accepted = append(accepted, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// With TLS 1.3 the dialer finishes its side of the handshake before the
	// node checks its certificate, so a refusal shows up as a TLS alert or a
	// closed connection on the first write or read; the node's log says why,
	// once per connection (counted below).
	refused, sent := 0, map[string]int{}
	check := func(target string, err error) bool {
		sent[target]++
		if err == nil {
			return false
		}
		refused++
		return true
	}
	for g := range groups {
		leader := before[nodes[0].id][g].leader
		for _, target := range nodes {
			// Pose as a node other than the target (and other than the
			// leader where possible), as a real candidate would.
			var pose *tlsNode
			for _, n := range nodes {
				if n != target && (pose == nil || n.id != leader) {
					pose = n
				}
			}
			hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(pose.id), Addr: []byte(pose.raft)}
			addr := raft.ServerAddress(target.raft)
			id := raft.ServerID(target.id)

			var vr raft.RequestVoteResponse
			err := f.trans[g].RequestVote(id, addr, &raft.RequestVoteRequest{RPCHeader: hdr, Term: forgedTerm,
				LastLogIndex: 1 << 40, LastLogTerm: forgedTerm, LeadershipTransfer: true}, &vr)
			if !check(target.id, err) {
				note("group %d: %s answered RequestVote (term %d, granted %v)", g, target.id, vr.Term, vr.Granted)
			}
			var ar raft.AppendEntriesResponse
			err = f.trans[g].AppendEntries(id, addr, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: forgedTerm + 1}, &ar)
			if !check(target.id, err) {
				note("group %d: %s answered AppendEntries (term %d, success %v)", g, target.id, ar.Term, ar.Success)
			}
			if target.id != leader {
				var tr raft.TimeoutNowResponse
				if err := f.trans[g].TimeoutNow(id, addr, &raft.TimeoutNowRequest{RPCHeader: hdr}, &tr); !check(target.id, err) {
					note("group %d: %s accepted TimeoutNow", g, target.id)
				}
			}
		}
	}
	for _, a := range accepted {
		t.Errorf("forged RPC with the client certificate: %s", a)
	}
	t.Logf("%d forged RPCs refused, %d answered", refused, len(accepted))

	// Give a successful forgery time to show (an election takes ~1 s), then
	// compare every node's view of every group with the one before.
	time.Sleep(3 * time.Second)
	after, err := clusterView(t, nodes, client, token)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		b, _ := os.ReadFile(n.logPath)
		if got := strings.Count(string(b), "not a node certificate"); got < sent[n.id] {
			t.Errorf("%s's log reports %d connections refused for the certificate, want %d (one per forged RPC)", n.id, got, sent[n.id])
		}
		for g := range groups {
			b, a := before[n.id][g], after[n.id][g]
			if a.term != b.term || a.leader != b.leader || a.state != b.state {
				t.Errorf("%s group %d: was %+v, now %+v", n.id, g, b, a)
			}
		}
	}
}

// legacyNodeCert overwrites certs/<node>.pem (and its key) with a node
// certificate as `tls init` wrote it before node certificates were marked:
// the same CA, names and usages, no tollgate://node URI SAN.
func legacyNodeCert(t *testing.T, certs, node string) {
	t.Helper()
	p := filepath.Join
	caPEM, err := os.ReadFile(p(certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := os.ReadFile(p(certs, "ca-key.pem"))
	kb, _ := pem.Decode(keyPEM)
	caKey, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: node},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{node, "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	if err := os.WriteFile(p(certs, node+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p(certs, node+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNodeRefusesClientAndLegacyCertificates runs the binary: a node given
// the client certificate, or a node certificate of earlier builds (no node
// URI SAN), exits at start with an error naming the file and the command
// that fixes it; after `tollgate tls node-cert` the same command line starts.
func TestNodeRefusesClientAndLegacyCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	certs := t.TempDir()
	if out, err := exec.Command(bin, "tls", "init", "--dir", certs, "--nodes", "node-1").CombinedOutput(); err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	p := filepath.Join
	tlsArgs := func(cert, key string) []string {
		return []string{"--tls-cert", p(certs, cert), "--tls-key", p(certs, key), "--tls-ca", p(certs, "ca.pem"), "--tls-client-auth", "require"}
	}
	refused := func(args []string, want ...string) {
		t.Helper()
		addrs := [3]string{freePort(t), freePort(t), freePort(t)}
		cmd := exec.Command(bin, append([]string{"server", "--dev", "--data-dir", t.TempDir(), "--grpc-addr", addrs[0],
			"--http-addr", addrs[1], "--raft-addr", addrs[2]}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("%v: still running after 60s, want a refusal:\n%s", args, out)
		}
		if err == nil {
			t.Fatalf("%v: exited 0, want a refusal:\n%s", args, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%v: output lacks %q:\n%s", args, w, out)
			}
		}
	}
	refused(tlsArgs("client.pem", "client-key.pem"), "tls_cert", p(certs, "client.pem"), "client certificate")
	// The client certificate as the raft certificate only.
	refused(append(tlsArgs("node-1.pem", "node-1-key.pem"), "--raft-tls-cert", p(certs, "client.pem"), "--raft-tls-key", p(certs, "client-key.pem")),
		"raft_tls_cert", "not a node certificate", "tollgate tls node-cert")

	legacyNodeCert(t, certs, "node-1")
	refused(tlsArgs("node-1.pem", "node-1-key.pem"), "tls_cert", p(certs, "node-1.pem"), "no tollgate://node/<name> URI SAN", "tollgate tls node-cert")

	if out, err := exec.Command(bin, "tls", "node-cert", "--dir", certs, "--nodes", "node-1").CombinedOutput(); err != nil {
		t.Fatalf("tls node-cert: %v\n%s", err, out)
	}
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	proc := startDev(t, bin, t.TempDir(), addrs, tlsArgs("node-1.pem", "node-1-key.pem")...)
	_ = proc.cmd.Process.Signal(syscall.SIGTERM)
	_ = proc.cmd.Wait()
}
