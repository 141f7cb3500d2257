package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/server"
)

// `tenant drop --dry-run` names what the drop would remove and removes
// nothing; the drop itself then removes exactly that. A real single-node
// server, the CLI's own command tree.
func TestTenantDropDryRun(t *testing.T) {
	s, err := server.New(server.Config{
		Node:    server.NodeConfig{DataDir: t.TempDir(), ID: "n1", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster: server.ClusterConfig{Bootstrap: true},
		Raft:    server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := newRootCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(args, "--addr", s.GRPCAddr()))
		err := cmd.Execute()
		return out.String(), err
	}
	if out, err := run("track", "--tenant", "team-a", "--count", "300"); err != nil || !strings.Contains(out, "300 accepted") {
		t.Fatalf("track: %v\n%s", err, out)
	}
	out, err := run("tenant", "drop", "team-a", "--dry-run")
	if err != nil || !strings.Contains(out, "300 series would be removed") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if n := s.Usage("team-a").Series; n != 300 {
		t.Fatalf("after the dry run the tenant holds %d series, want 300", n)
	}
	if out, err := run("tenant", "drop", "team-b", "--dry-run"); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("dry run of an unknown tenant: %v\n%s", err, out)
	}
	if out, err := run("tenant", "drop", "team-a"); err != nil || !strings.Contains(out, "300 series removed") {
		t.Fatalf("drop: %v\n%s", err, out)
	}
	if n := s.Usage("team-a").Series; n != 0 {
		t.Fatalf("after the drop the tenant holds %d series", n)
	}
}
