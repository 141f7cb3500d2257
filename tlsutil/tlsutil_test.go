package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func devPKI(t *testing.T, hosts ...string) DevFiles {
	t.Helper()
	f, err := InitDev(DevOptions{Dir: t.TempDir(), Nodes: []string{"n1", "n2"}, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestInitDevChainsAndSANs(t *testing.T) {
	f := devPKI(t, "172.29.74.11", "node-1", "node-1")
	pool, err := LoadCA(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := LoadKeyPair(f.Nodes["n1"][0], f.Nodes["n1"][1])
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	for _, name := range []string{"n1", "localhost", "node-1", "127.0.0.1", "172.29.74.11", "::1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("node cert for %s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "n2"}); err == nil {
		t.Error("n1's certificate verifies as n2")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node cert as a client cert: %v", err)
	}
	cl, err := LoadKeyPair(f.Client, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert: %v", err)
	}
	if _, err := cl.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the client certificate is accepted as a server certificate")
	}
	if pair.Leaf.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("key algorithm %v, want ECDSA", pair.Leaf.PublicKeyAlgorithm)
	}
	for _, k := range []string{f.CAKey, f.Nodes["n2"][1], f.ClientKey, f.GossipKey} {
		st, err := os.Stat(k)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", k, st.Mode().Perm(), err)
		}
	}
	keys, err := ReadGossipKeyring(f.GossipKey)
	if err != nil || len(keys) != 1 || len(keys[0]) != 32 {
		t.Fatalf("gossip key: %v %v", keys, err)
	}
	// A second run refuses to replace the CA.
	if _, err := InitDev(DevOptions{Dir: filepath.Dir(f.CA), Nodes: []string{"n1"}}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second init: %v", err)
	}
	if _, err := InitDev(DevOptions{Dir: filepath.Dir(f.CA), Nodes: []string{"n1"}, Force: true}); err != nil {
		t.Fatalf("forced init: %v", err)
	}
}

func write(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadErrorsNameTheFile: every way a file can be wrong gives an error that
// names it, never a panic or a bare "tls: failed to find any PEM data".
func TestLoadErrorsNameTheFile(t *testing.T) {
	f := devPKI(t)
	other := devPKI(t)
	dir := t.TempDir()
	garbage := write(t, dir, "garbage.pem", "this is not PEM\n")
	truncated := write(t, dir, "truncated.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	keyData, _ := os.ReadFile(f.Nodes["n1"][1])
	keyAsCert := write(t, dir, "key-as-cert.pem", string(keyData))
	certData, _ := os.ReadFile(f.CA)
	certAsKey := write(t, dir, "cert-as-key.pem", string(certData))
	trailing := write(t, dir, "trailing.pem", string(certData)+"\n-----BEGIN CERTIFICATE-----\nnot base64!\n")
	missing := filepath.Join(dir, "missing.pem")

	cases := []struct {
		name string
		err  func() error
		want []string
	}{
		{"missing cert", func() error { _, err := LoadKeyPair(missing, f.Nodes["n1"][1]); return err }, []string{missing, "no such file"}},
		{"missing key", func() error { _, err := LoadKeyPair(f.Nodes["n1"][0], missing); return err }, []string{missing}},
		{"garbage cert", func() error { _, err := LoadKeyPair(garbage, f.Nodes["n1"][1]); return err }, []string{garbage, "no PEM certificate"}},
		{"truncated cert", func() error { _, err := LoadKeyPair(truncated, f.Nodes["n1"][1]); return err }, []string{truncated}},
		{"key given as cert", func() error { _, err := LoadKeyPair(keyAsCert, f.Nodes["n1"][1]); return err }, []string{keyAsCert, "PRIVATE KEY"}},
		{"cert given as key", func() error { _, err := LoadKeyPair(f.Nodes["n1"][0], certAsKey); return err }, []string{certAsKey, "no PEM private key"}},
		{"garbage key", func() error { _, err := LoadKeyPair(f.Nodes["n1"][0], garbage); return err }, []string{garbage}},
		{"key of another cert", func() error { _, err := LoadKeyPair(f.Nodes["n1"][0], other.Nodes["n1"][1]); return err },
			[]string{f.Nodes["n1"][0], other.Nodes["n1"][1], "does not match"}},
		{"missing ca", func() error { _, err := LoadCA(missing); return err }, []string{missing}},
		{"garbage ca", func() error { _, err := LoadCA(garbage); return err }, []string{garbage}},
		{"trailing garbage in ca", func() error { _, err := LoadCA(trailing); return err }, []string{trailing, "unparseable"}},
		{"require without ca", func() error { _, err := ServerConfig(f.Nodes["n1"][0], f.Nodes["n1"][1], "", "require"); return err }, []string{"CA"}},
		{"bad client auth", func() error { _, err := ServerConfig(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA, "always"); return err }, []string{"always", "none, request or require"}},
		{"client cert without key", func() error { _, err := ClientConfig(f.Client, "", f.CA, ""); return err }, []string{"both"}},
		{"peer without ca", func() error { _, _, err := PeerConfigs(f.Nodes["n1"][0], f.Nodes["n1"][1], ""); return err }, []string{"CA"}},
	}
	for _, c := range cases {
		err := c.err()
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
}

func TestExpiredCertificateRefused(t *testing.T) {
	dir := t.TempDir()
	f, err := InitDev(DevOptions{Dir: dir, Nodes: []string{"n1"}, Now: time.Now().Add(-48 * time.Hour), Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, err = LoadKeyPair(f.Nodes["n1"][0], f.Nodes["n1"][1])
	if err == nil || !strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), f.Nodes["n1"][0]) {
		t.Fatalf("expired cert: %v", err)
	}
}

// handshake runs one real TLS handshake on loopback and returns the client's
// and the server's errors.
func handshake(t *testing.T, server, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		err = tc.Handshake()
		if err == nil {
			// With TLS 1.3 the server verifies the client's certificate after
			// the client considers the handshake done; a read surfaces it.
			_, err = io.ReadFull(tc, make([]byte, 1))
		}
		done <- err
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err == nil {
		if _, err = c.Write([]byte{1}); err == nil {
			_, err = c.Read(make([]byte, 1)) // the server closes: EOF when accepted, an alert when not
			if errors.Is(err, io.EOF) {
				err = nil
			}
		}
		c.Close()
	}
	return err, <-done
}

func TestHandshakes(t *testing.T) {
	f := devPKI(t)
	other := devPKI(t)
	srv, err := ServerConfig(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA, ClientAuthRequire)
	if err != nil {
		t.Fatal(err)
	}
	good, err := ClientConfig(f.Client, f.ClientKey, f.CA, "")
	if err != nil {
		t.Fatal(err)
	}
	good.ServerName = "n1"
	if cerr, serr := handshake(t, srv, good); cerr != nil || serr != nil {
		t.Fatalf("valid client: client %v, server %v", cerr, serr)
	}
	noCert, _ := ClientConfig("", "", f.CA, "n1")
	if _, serr := handshake(t, srv, noCert); serr == nil {
		t.Fatal("client without a certificate accepted under require")
	}
	foreign, _ := ClientConfig(other.Client, other.ClientKey, f.CA, "n1")
	if _, serr := handshake(t, srv, foreign); serr == nil {
		t.Fatal("client certificate from another CA accepted")
	}
	untrusting, _ := ClientConfig(f.Client, f.ClientKey, other.CA, "n1")
	if cerr, _ := handshake(t, srv, untrusting); cerr == nil {
		t.Fatal("client trusting another CA accepted the server")
	}
	wrongName, _ := ClientConfig(f.Client, f.ClientKey, f.CA, "n9")
	if cerr, _ := handshake(t, srv, wrongName); cerr == nil {
		t.Fatal("server certificate accepted for a name it does not hold")
	}
	// request: no certificate is fine, a foreign one is not.
	req, _ := ServerConfig(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA, ClientAuthRequest)
	if cerr, serr := handshake(t, req, noCert); cerr != nil || serr != nil {
		t.Fatalf("request mode without a certificate: %v %v", cerr, serr)
	}
	if _, serr := handshake(t, req, foreign); serr == nil {
		t.Fatal("request mode accepted a certificate from another CA")
	}
	// Peer (raft) configs: mutual both ways.
	ps, pc, err := PeerConfigs(f.Nodes["n1"][0], f.Nodes["n1"][1], f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pc.ServerName = "127.0.0.1"
	if cerr, serr := handshake(t, ps, pc); cerr != nil || serr != nil {
		t.Fatalf("peers: %v %v", cerr, serr)
	}
	_, rogue, _ := PeerConfigs(other.Nodes["n1"][0], other.Nodes["n1"][1], f.CA)
	rogue.ServerName = "127.0.0.1"
	if _, serr := handshake(t, ps, rogue); serr == nil {
		t.Fatal("peer with a certificate from another CA accepted")
	}
}

func TestGossipKeys(t *testing.T) {
	k, err := NewGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	if b, err := ParseGossipKey(k); err != nil || len(b) != 32 {
		t.Fatalf("parse generated key: %d bytes, %v", len(b), err)
	}
	for _, bad := range []string{"", "!!!", base64.StdEncoding.EncodeToString(make([]byte, 31))} {
		if _, err := ParseGossipKey(bad); err == nil {
			t.Errorf("ParseGossipKey(%q): no error", bad)
		}
	}
	dir := t.TempDir()
	k2, _ := NewGossipKey()
	lines := write(t, dir, "keys", "# primary first\n"+k+"\n\n"+k2+"\n")
	keys, err := ReadGossipKeyring(lines)
	if err != nil || len(keys) != 2 {
		t.Fatalf("line keyring: %d keys, %v", len(keys), err)
	}
	js := write(t, dir, "keys.json", `["`+k+`","`+k2+`"]`)
	if keys, err := ReadGossipKeyring(js); err != nil || len(keys) != 2 {
		t.Fatalf("json keyring: %d keys, %v", len(keys), err)
	}
	bad := write(t, dir, "bad", k+"\nnot-a-key\n")
	if _, err := ReadGossipKeyring(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "key 2") {
		t.Fatalf("bad keyring: %v", err)
	}
	empty := write(t, dir, "empty", "# nothing\n")
	if _, err := ReadGossipKeyring(empty); err == nil || !strings.Contains(err.Error(), "no key") {
		t.Fatalf("empty keyring: %v", err)
	}
}
