package faulttest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tollgate-io/tollgate/api"
)

// TestCertificateRotation runs the runbook's CA rotation with real processes
// under load, the nodes reading their TLS files from fixed paths (gRPC, HTTP
// and raft mutual TLS): (1) the CA file becomes old+new CA, rolling restart;
// (2) the node certificate and key become ones the new CA signed, rolling
// restart; (3) the CA file becomes the new CA alone, rolling restart. Every
// step keeps a quorum and accepts writes; no acknowledged series is lost; at
// the end the old CA no longer verifies any node and the new one does. The
// gossip key rotates along with the same restarts ([old, new], [new, old],
// [new]) and every node sees every other alive after each step.
func TestCertificateRotation(t *testing.T) {
	bin := tollgateBinary(t)
	root := t.TempDir()
	oldDir, newDir, live := filepath.Join(root, "old"), filepath.Join(root, "new"), filepath.Join(root, "live")
	for _, d := range []string{oldDir, newDir} {
		if out, err := exec.Command(bin, "tls", "init", "--dir", d, "--nodes", "node").CombinedOutput(); err != nil {
			t.Fatalf("tls init --dir %s: %v\n%s", d, err, out)
		}
	}
	if err := os.MkdirAll(live, 0o755); err != nil {
		t.Fatal(err)
	}
	read := func(path string) []byte {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	install := func(name string, data []byte) {
		t.Helper()
		// Replaced as a whole (write, rename), as configuration management does.
		tmp := filepath.Join(live, name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(live, name)); err != nil {
			t.Fatal(err)
		}
	}
	oldCA, newCA := read(filepath.Join(oldDir, "ca.pem")), read(filepath.Join(newDir, "ca.pem"))
	install("ca.pem", oldCA)
	install("node.pem", read(filepath.Join(oldDir, "node.pem")))
	install("node-key.pem", read(filepath.Join(oldDir, "node-key.pem")))
	oldKey, newKey := read(filepath.Join(oldDir, "gossip.key")), read(filepath.Join(newDir, "gossip.key"))
	keyring := func(keys ...[]byte) []byte {
		return []byte(strings.Join(strings.Fields(string(bytes.Join(keys, []byte("\n")))), "\n") + "\n")
	}
	install("gossip.keyring", keyring(oldKey))

	// The harness and the checker trust both CAs, as clients are given the
	// new CA before the nodes' certificates change.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(oldCA)
	pool.AppendCertsFromPEM(newCA)
	opts := defaultClusterOptions()
	opts.extraArgs = []string{"--tls-cert", filepath.Join(live, "node.pem"), "--tls-key", filepath.Join(live, "node-key.pem"),
		"--tls-ca", filepath.Join(live, "ca.pem"), "--gossip-keyring-file", filepath.Join(live, "gossip.keyring")}
	opts.clientTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c := newCluster(t, opts)
	ck := startChecker(t, c, defaultCheckerConfig())
	ck.waitProgress("start")
	loadFor(2 * time.Second)

	rolling := func(step string) {
		t.Helper()
		for _, n := range c.nodes {
			n.term(t)
			ck.waitProgress(step + ": " + n.id + " stopped")
			n.restart(t)
			c.waitHealthy()
			ck.waitProgress(step + ": " + n.id + " restarted")
		}
		c.waitGossipAlive(t)
		loadFor(time.Second)
	}
	// The gossip key rotates along: [old, new], [new, old], [new].
	install("ca.pem", append(append([]byte(nil), oldCA...), newCA...))
	install("gossip.keyring", keyring(oldKey, newKey))
	rolling("old+new CA")
	install("node.pem", read(filepath.Join(newDir, "node.pem")))
	install("node-key.pem", read(filepath.Join(newDir, "node-key.pem")))
	install("gossip.keyring", keyring(newKey, oldKey))
	rolling("new certificates")
	install("ca.pem", newCA)
	install("gossip.keyring", keyring(newKey))
	rolling("new CA only")
	ck.finish()

	// The old CA verifies no node any more; the new one does, for the CLI too.
	oldOnly := x509.NewCertPool()
	oldOnly.AppendCertsFromPEM(oldCA)
	for _, n := range c.nodes {
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: oldOnly, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := adminCtx(context.Background(), 5*time.Second)
		_, err = api.NewAdminClient(cc).NodeGroups(ctx, &api.NodeGroupsRequest{})
		cancel()
		cc.Close()
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: a client trusting only the old CA: %v, want a certificate error", n.id, err)
		}
	}
	if _, err := c.tollgateCLI(time.Minute, "status", "--addr", c.nodes[0].grpcAddr, "--cacert", filepath.Join(newDir, "ca.pem")); err != nil {
		t.Errorf("tollgate status with the new CA: %v", err)
	}
	if _, err := c.tollgateCLI(time.Minute, "status", "--addr", c.nodes[0].grpcAddr, "--cacert", filepath.Join(oldDir, "ca.pem"), "--timeout", "5s"); err == nil {
		t.Errorf("tollgate status with the old CA succeeded")
	}
}

// waitGossipAlive waits until every node's view lists every node of the
// cluster as alive (gossip works between all of them).
func (c *cluster) waitGossipAlive(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(healthyTimeout)
	last := ""
	for time.Now().Before(deadline) {
		last = ""
		for _, via := range c.nodes {
			ctx, cancel := adminCtx(context.Background(), adminCallTO)
			st, err := c.admin(via).Status(ctx, &api.StatusRequest{})
			cancel()
			if err != nil {
				last = fmt.Sprintf("%s: %v", via.id, err)
				break
			}
			status := map[string]string{}
			for _, m := range st.GetView().GetMembers() {
				status[m.Id] = m.Status
			}
			for _, n := range c.nodes {
				if status[n.id] != "alive" {
					last = fmt.Sprintf("%s sees %s as %q", via.id, n.id, status[n.id])
				}
			}
		}
		if last == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("gossip: %s after %v", last, healthyTimeout)
}
