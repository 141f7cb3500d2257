package tlsutil

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caOf loads the CA InitDev wrote, to sign extra certificates in tests.
func caOf(t *testing.T, f DevFiles) leafIssuer {
	t.Helper()
	data, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	cas, err := parseCerts(f.CA, data)
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := os.ReadFile(f.CAKey)
	b, _ := pem.Decode(kp)
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leafIssuer{now: time.Now(), validity: time.Hour, ca: cas[0], caKey: k.(*ecdsa.PrivateKey)}
}

func TestNodeCertificatesAreMarked(t *testing.T) {
	f := devPKI(t)
	for _, n := range []string{"n1", "n2"} {
		pair, err := LoadKeyPair(f.Nodes[n][0], f.Nodes[n][1])
		if err != nil {
			t.Fatal(err)
		}
		if name, ok := NodeName(pair.Leaf); !ok || name != n {
			t.Errorf("%s: node name %q %v", n, name, ok)
		}
		if got := pair.Leaf.URIs; len(got) != 1 || got[0].String() != "tollgate://node/"+n {
			t.Errorf("%s: URIs %v", n, got)
		}
	}
	cl, err := LoadKeyPair(f.Client, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := NodeName(cl.Leaf); ok {
		t.Fatalf("the client certificate is a node certificate (%q)", name)
	}
	for _, u := range []string{"tollgate://node/", "tollgate://client/n1", "spiffe://node/n1", "tollgate://node/a/b", "tollgate://x@node/n1"} {
		c := &x509.Certificate{}
		c.URIs = append(c.URIs, mustURL(t, u))
		if _, ok := NodeName(c); ok {
			t.Errorf("%s taken for a node URI", u)
		}
	}
}

// TestClientCertificateRefusedAsNode: a node given the client certificate (or
// a certificate of earlier builds, without the node URI) does not start, and
// the error names the file and the command that fixes it.
func TestClientCertificateRefusedAsNode(t *testing.T) {
	f := devPKI(t)
	_, _, err := PeerConfigs(f.Client, f.ClientKey, f.CA)
	if !errors.Is(err, ErrNotNodeCert) {
		t.Fatalf("client certificate as the raft certificate: %v", err)
	}
	for _, w := range []string{f.Client, "client certificate", "tollgate tls node-cert"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if _, err := ServerConfig(f.Client, f.ClientKey, f.CA, ClientAuthRequire); err == nil || !strings.Contains(err.Error(), "client certificate") ||
		!strings.Contains(err.Error(), f.Client) {
		t.Fatalf("client certificate as a listener's certificate: %v", err)
	}

	// A node certificate as earlier builds issued it: server and client
	// auth, the node's names, no URI SAN.
	ca := caOf(t, f)
	dir := t.TempDir()
	legacy, legacyKey := filepath.Join(dir, "n1.pem"), filepath.Join(dir, "n1-key.pem")
	if err := ca.issue("n1", []string{"n1", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, legacy, legacyKey); err != nil {
		t.Fatal(err)
	}
	_, _, err = PeerConfigs(legacy, legacyKey, f.CA)
	if !errors.Is(err, ErrNotNodeCert) || !strings.Contains(err.Error(), "no tollgate://node/<name> URI SAN") || !strings.Contains(err.Error(), legacy) {
		t.Fatalf("legacy node certificate: %v", err)
	}
	if _, err := ServerConfig(legacy, legacyKey, f.CA, ClientAuthRequire); err != nil {
		t.Fatalf("a legacy node certificate still serves gRPC/HTTP: %v", err)
	}
}

// TestRaftPeersMustBeNodes runs real handshakes between the raft sides of
// PeerConfigs and every kind of certificate the CA signs.
func TestRaftPeersMustBeNodes(t *testing.T) {
	f := devPKI(t)
	ps, pc, err := PeerConfigs(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA)
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := PeerConfigs(f.Nodes["n2"][0], f.Nodes["n2"][1], f.CA)
	if err != nil {
		t.Fatal(err)
	}
	other.ServerName = "127.0.0.1"
	if cerr, serr := handshake(t, ps, other); cerr != nil || serr != nil {
		t.Fatalf("node to node: client %v, server %v", cerr, serr)
	}

	// The client certificate dials the raft port.
	client, _ := ClientConfig(f.Client, f.ClientKey, f.CA, "127.0.0.1")
	if _, serr := handshake(t, ps, client); !errors.Is(serr, ErrNotNodeCert) {
		t.Fatalf("client certificate on the raft port: server error %v, want %v", serr, ErrNotNodeCert)
	}

	// A CA-signed server certificate without the node URI answers a node's
	// dial: the node refuses to talk raft to it.
	ca := caOf(t, f)
	dir := t.TempDir()
	imp, impKey := filepath.Join(dir, "imp.pem"), filepath.Join(dir, "imp-key.pem")
	if err := ca.issue("n2", []string{"n2", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, imp, impKey); err != nil {
		t.Fatal(err)
	}
	impostor, err := ServerConfig(imp, impKey, f.CA, ClientAuthRequire)
	if err != nil {
		t.Fatal(err)
	}
	pc.ServerName = "127.0.0.1"
	if cerr, _ := handshake(t, impostor, pc); !errors.Is(cerr, ErrNotNodeCert) {
		t.Fatalf("node dialing a non-node server: client error %v, want %v", cerr, ErrNotNodeCert)
	}
}

// TestIssueNodeCertsKeepsTheCA: `tls node-cert` adds or replaces node
// certificates from the existing CA and leaves everything else alone.
func TestIssueNodeCertsKeepsTheCA(t *testing.T) {
	f := devPKI(t)
	dir := filepath.Dir(f.CA)
	keep := map[string][]byte{}
	for _, p := range []string{f.CA, f.CAKey, f.Client, f.ClientKey, f.GossipKey, f.Nodes["n2"][0]} {
		keep[p], _ = os.ReadFile(p)
	}
	oldN1, _ := os.ReadFile(f.Nodes["n1"][0])
	g, err := IssueNodeCerts(DevOptions{Dir: dir, Nodes: []string{"n1", "n3"}, Hosts: []string{"10.1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range keep {
		if now, _ := os.ReadFile(p); !bytes.Equal(now, b) {
			t.Errorf("%s changed", p)
		}
	}
	if now, _ := os.ReadFile(g.Nodes["n1"][0]); bytes.Equal(now, oldN1) {
		t.Error("n1's certificate was not reissued")
	}
	pool, _ := LoadCA(f.CA)
	for _, n := range []string{"n1", "n3"} {
		pair, err := LoadKeyPair(g.Nodes[n][0], g.Nodes[n][1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.1.2.3"}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
		if name, ok := NodeName(pair.Leaf); !ok || name != n {
			t.Errorf("%s: node name %q", n, name)
		}
		if _, _, err := PeerConfigs(g.Nodes[n][0], g.Nodes[n][1], f.CA); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := IssueNodeCerts(DevOptions{Dir: t.TempDir(), Nodes: []string{"n1"}}); err == nil || !strings.Contains(err.Error(), "tollgate tls init") {
		t.Fatalf("no CA in the directory: %v", err)
	}
	other := devPKI(t)
	if err := os.WriteFile(f.CAKey, mustRead(t, other.CAKey), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := IssueNodeCerts(DevOptions{Dir: dir, Nodes: []string{"n1"}}); err == nil || !strings.Contains(err.Error(), "not the key of the CA") {
		t.Fatalf("mismatched CA key: %v", err)
	}
	if _, err := IssueNodeCerts(DevOptions{Dir: dir, Nodes: []string{"../x"}}); err == nil {
		t.Fatal("a node name with a path was accepted")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
