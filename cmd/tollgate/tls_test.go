package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate-io/tollgate/tlsutil"
)

func devCerts(t *testing.T) tlsutil.DevFiles {
	t.Helper()
	f, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: t.TempDir(), Nodes: []string{"node-1"}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestTLSSettings(t *testing.T) {
	f := devCerts(t)
	node := f.Nodes["node-1"]
	gk, _ := os.ReadFile(f.GossipKey)
	s, err := loadSettings(t, map[string]string{"TOLLGATE_TLS_CA": f.CA, "TOLLGATE_GOSSIP_KEY": strings.TrimSpace(string(gk))},
		"--dev", "--tls-cert", node[0], "--tls-key", node[1], "--tls-client-auth", "require", "--tls-http-client-auth", "none")
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg.Access.TLS
	if c.GRPC == nil || c.HTTP == nil || c.Peer == nil || c.RaftServer == nil || c.RaftClient == nil || len(c.GossipKeys) != 1 {
		t.Fatalf("TLS not fully configured: %+v", c)
	}
	if got := serverTLSInfo(c); got != "grpc (client certs: require), http (client certs: none), raft (mutual), gossip (encrypted)" {
		t.Errorf("banner: %q", got)
	}
	if s, err := loadSettings(t, nil, "--dev"); err != nil || s.cfg.Access.TLS.GRPC != nil || serverTLSInfo(s.cfg.Access.TLS) != "off (plaintext)" {
		t.Fatalf("default is plaintext: %v %+v", err, s.cfg.Access.TLS)
	}

	bad := writeFile(t, "garbage.pem", "not a certificate")
	missing := filepath.Join(t.TempDir(), "nope.pem")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--tls-cert", missing, "--tls-key", node[1], "--tls-ca", f.CA}, []string{"tls_cert", missing, "--tls-cert"}},
		{[]string{"--tls-cert", bad, "--tls-key", node[1], "--tls-ca", f.CA}, []string{"tls_cert", bad, "no PEM certificate"}},
		{[]string{"--tls-cert", node[0], "--tls-key", node[1], "--tls-ca", bad}, []string{bad}},
		{[]string{"--tls-cert", node[0], "--tls-key", node[1]}, []string{"raft_tls_ca", "needs a CA"}},
		{[]string{"--tls-cert", node[0]}, []string{"both tls_cert and tls_key"}},
		{[]string{"--tls-ca", f.CA}, []string{"need tls_cert"}},
		{[]string{"--tls-cert", node[0], "--tls-key", node[1], "--tls-ca", f.CA, "--tls-client-auth", "maybe"}, []string{"tls_client_auth", "maybe"}},
		{[]string{"--gossip-key", "c2hvcnQ="}, []string{"gossip_key", "5 bytes"}},
		// The client certificate given to a node: refused as its listeners'
		// and as its raft certificate, with what to do.
		{[]string{"--tls-cert", f.Client, "--tls-key", f.ClientKey, "--tls-ca", f.CA}, []string{"tls_cert", f.Client, "client certificate", "tollgate tls node-cert"}},
		{[]string{"--tls-cert", node[0], "--tls-key", node[1], "--tls-ca", f.CA, "--raft-tls-cert", f.Client, "--raft-tls-key", f.ClientKey},
			[]string{"raft_tls_cert", f.Client, "not a node certificate", "tollgate tls node-cert"}},
		{[]string{"--gossip-keyring-file", bad}, []string{"gossip_keyring_file", bad}},
		{[]string{"--gossip-key", string(gk), "--gossip-keyring-file", f.GossipKey}, []string{"not both"}},
	}
	for _, tc := range cases {
		_, err := loadSettings(t, nil, append([]string{"--dev"}, tc.args...)...)
		if err == nil {
			t.Errorf("%v: no error", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", tc.args, err, w)
			}
		}
	}
}

// TestCLIOverTLS runs the real binary: `tollgate tls init`, a dev server
// requiring client certificates, and the client commands with and without
// TOLLGATE_CACERT/CERT/KEY; the admin token still applies over TLS.
func TestCLIOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	certs := t.TempDir()
	if out, err := exec.Command(bin, "tls", "init", "--dir", certs, "--nodes", "dev").CombinedOutput(); err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	p := filepath.Join
	addrs := [3]string{freePort(t), freePort(t), freePort(t)}
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tls-token")
	proc := startDev(t, bin, t.TempDir(), addrs, "--tls-cert", p(certs, "dev.pem"), "--tls-key", p(certs, "dev-key.pem"),
		"--tls-ca", p(certs, "ca.pem"), "--tls-client-auth", "require", "--gossip-keyring-file", p(certs, "gossip.key"))
	defer func() {
		_ = proc.cmd.Process.Signal(syscall.SIGTERM)
		_ = proc.cmd.Wait()
	}()
	tlsEnv := []string{"TOLLGATE_CACERT=" + p(certs, "ca.pem"), "TOLLGATE_CERT=" + p(certs, "client.pem"), "TOLLGATE_KEY=" + p(certs, "client-key.pem")}
	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	track := []string{"track", "--addr", addrs[0], "--tenant", "t", "--count", "10", "--timeout", "5s"}
	if out, err := run(tlsEnv, track...); err != nil || !strings.Contains(out, "10 accepted") {
		t.Fatalf("track over TLS: %v\n%s", err, out)
	}
	if out, err := run(nil, track...); err == nil {
		t.Fatalf("plaintext track against a TLS node succeeded:\n%s", out)
	} else if !strings.Contains(out, "may serve TLS") {
		t.Fatalf("plaintext track against a TLS node: want a hint about TLS:\n%s", out)
	}
	if out, err := run(nil, "status", "--addr", addrs[0], "--timeout", "5s"); err == nil || !strings.Contains(out, "may serve TLS") {
		t.Fatalf("plaintext status against a TLS node: %v, want a hint about TLS:\n%s", err, out)
	}
	// A missing or foreign client certificate is named as such, not left to
	// look like a timeout.
	if out, err := run(tlsEnv[:1], track...); err == nil || !strings.Contains(out, "requires a client certificate") {
		t.Fatalf("track without a client certificate: %v, want the missing certificate named:\n%s", err, out)
	}
	if out, err := run(tlsEnv[:1], "status", "--addr", addrs[0], "--timeout", "5s"); err == nil || !strings.Contains(out, "requires a client certificate") {
		t.Fatalf("status without a client certificate: %v, want the missing certificate named:\n%s", err, out)
	}
	other := t.TempDir()
	if out, err := exec.Command(bin, "tls", "init", "--dir", other, "--nodes", "dev").CombinedOutput(); err != nil {
		t.Fatalf("tls init (foreign CA): %v\n%s", err, out)
	}
	foreign := []string{tlsEnv[0], "TOLLGATE_CERT=" + p(other, "client.pem"), "TOLLGATE_KEY=" + p(other, "client-key.pem")}
	for _, args := range [][]string{track, {"status", "--addr", addrs[0], "--timeout", "5s"}} {
		if out, err := run(foreign, args...); err == nil || !strings.Contains(out, "refused this client's certificate") {
			t.Fatalf("%s with a foreign client certificate: %v, want the refusal named:\n%s", args[0], err, out)
		}
	}
	if out, err := run(tlsEnv, "health", "--http-addr", addrs[1]); err != nil || !strings.Contains(out, "ready") {
		t.Fatalf("health over TLS: %v\n%s", err, out)
	}
	// usage query/bill over the node's HTTPS listener with the same CA file
	// (it once spoke plaintext HTTP only).
	bill := []string{"usage", "bill", "--http", addrs[1], "--tenant", "t", "--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z"}
	if out, err := run(tlsEnv, bill...); err != nil || !strings.Contains(out, "p95 active series") {
		t.Fatalf("usage bill over TLS: %v\n%s", err, out)
	}
	if out, err := run(tlsEnv, "usage", "query", "--http", addrs[1], "--organization-id", "o", "--from", "2026-11-01T00:00:00Z"); err != nil {
		t.Fatalf("usage query over TLS: %v\n%s", err, out)
	}
	if out, err := run(nil, bill...); err == nil {
		t.Fatalf("plaintext usage bill against a TLS node succeeded:\n%s", out)
	}
	if out, err := run(tlsEnv, "status", "--addr", addrs[0]); err != nil || !strings.Contains(out, "dev") {
		t.Fatalf("status over TLS with the token: %v\n%s", err, out)
	}
	if out, err := run(append(tlsEnv, "TOLLGATE_ADMIN_TOKEN="), "status", "--addr", addrs[0], "--timeout", "5s"); err == nil || !strings.Contains(out, "Unauthenticated") {
		t.Fatalf("status over TLS without the token: %v\n%s", err, out)
	}
	if out, err := run(tlsEnv, "bench", "--addr", addrs[0], "--duration", "1s", "--tenants", "2", "--series-per-tenant", "1000"); err != nil {
		t.Fatalf("bench over TLS: %v\n%s", err, out)
	}
}
