package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/metering/interval"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/service/metering"
)

// TestUsageCommands runs `tollgate usage query` and `usage bill` against a
// real single-node server whose metering clock the test drives.
func TestUsageCommands(t *testing.T) {
	s, err := server.New(server.Config{
		Node:     server.NodeConfig{DataDir: t.TempDir(), ID: "n1", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster:  server.ClusterConfig{Bootstrap: true},
		Raft:     server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Metering: metering.Config{Granularity: interval.Hour, TestClock: true},
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
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).UnixMilli()
	if err := s.Metering().Clock().Set(t0 + 2*3_600_000); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"id":"a","timestamp":%d,"organization_id":"o","space_id":"s","consumer_id":"c","resource_id":"r","plan_id":"p","resource_instance_id":"i","measured_usage":[{"measure":"memory","quantity":2}]}`, t0+1_800_000)
	resp, err := http.Post("http://"+s.HTTPAddr()+"/v1/events/start", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("start: %v %v", resp, err)
	}
	resp.Body.Close()
	var out bytes.Buffer
	for range 500 {
		out.Reset()
		cmd := newRootCmd()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"usage", "query", "--http", s.HTTPAddr(), "--organization-id", "o", "--from", "2026-11-23T00:00:00Z"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if strings.Count(out.String(), "duration=") == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "duration=1.8e+06") || !strings.Contains(out.String(), "duration=3.6e+06") {
		t.Fatalf("usage query output:\n%s", out.String())
	}
	out.Reset()
	cmd := newRootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"usage", "bill", "--http", s.HTTPAddr(), "--tenant", "nobody", "--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "p95 active series 0") {
		t.Fatalf("bill output: %s", out.String())
	}
	cmd = newRootCmd()
	cmd.SetArgs([]string{"usage", "bill", "--http", s.HTTPAddr(), "--tenant", "x"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("bill without --from/--to accepted")
	}
}

// TestUsageClock drives `tollgate usage clock` against a real test-clock node
// and a real node without the test clock that has an admin token.
func TestUsageClock(t *testing.T) {
	start := func(testClock bool, token string) *server.Server {
		s, err := server.New(server.Config{
			Node:     server.NodeConfig{DataDir: t.TempDir(), ID: "n1", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
			Cluster:  server.ClusterConfig{Bootstrap: true},
			Raft:     server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
			Access:   server.AccessConfig{AdminToken: token},
			Metering: metering.Config{TestClock: testClock},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop(context.Background()) })
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := newRootCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"usage", "clock"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	test := start(true, "")
	t0 := time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)
	out, err := run("--addr", test.GRPCAddr(), "--set", "2026-11-23T05:00:00Z")
	if err != nil || !strings.Contains(out, "metering clock 2026-11-23T05:00:00Z (test clock)") || test.Metering().Clock().Now() != t0.UnixMilli() {
		t.Fatalf("clock --set: %v\n%s", err, out)
	}
	out, err = run("--addr", test.GRPCAddr(), "--advance", "720h", "--json")
	if want := t0.Add(720 * time.Hour).UnixMilli(); err != nil || !strings.Contains(out, fmt.Sprintf(`"now_ms":%d`, want)) || test.Metering().Clock().Now() != want {
		t.Fatalf("clock --advance: %v\n%s", err, out)
	}
	if _, err := run("--addr", test.GRPCAddr(), "--advance", "-1m"); err == nil || !strings.Contains(err.Error(), "backwards") {
		t.Fatalf("negative advance: %v", err)
	}

	prod := start(false, "s3cret")
	if _, err := run("--addr", prod.GRPCAddr(), "--set", "1"); err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Fatalf("clock without the token: %v", err)
	}
	before := prod.Metering().Clock().Now()
	_, err = run("--addr", prod.GRPCAddr(), "--token", "s3cret", "--set", "1")
	if err == nil || !strings.Contains(err.Error(), "--metering-test-clock") {
		t.Fatalf("clock on a node without the test clock: %v", err)
	}
	if now := prod.Metering().Clock().Now(); now < before {
		t.Fatalf("refused clock moved from %d to %d", before, now)
	}
	out, err = run("--addr", prod.GRPCAddr(), "--token", "s3cret")
	if err != nil || !strings.Contains(out, "wall clock, not settable") {
		t.Fatalf("reading the clock: %v\n%s", err, out)
	}
}

// TestUsageToken: on a node with an admin token, `tollgate usage bill` is
// refused without a credential (naming the missing token) and answered
// with --client-token or, by default, TOLLGATE_ADMIN_TOKEN.
func TestUsageToken(t *testing.T) {
	t.Setenv("TOLLGATE_TOKEN", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "")
	s, err := server.New(server.Config{
		Node:    server.NodeConfig{DataDir: t.TempDir(), ID: "n1", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster: server.ClusterConfig{Bootstrap: true},
		Raft:    server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Access:  server.AccessConfig{AdminToken: "s3cret"},
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
	bill := func(extra ...string) (string, error) {
		var out bytes.Buffer
		cmd := newRootCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"usage", "bill", "--http", s.HTTPAddr(), "--tenant", "t", "--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z"}, extra...))
		err := cmd.Execute()
		return out.String(), err
	}
	if _, err := bill(); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without a token: %v, want HTTP 401", err)
	}
	if out, err := bill("--client-token", "s3cret"); err != nil || !strings.Contains(out, "p95 active series") {
		t.Fatalf("with --client-token: %v %s", err, out)
	}
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "s3cret")
	if out, err := bill(); err != nil || !strings.Contains(out, "p95 active series") {
		t.Fatalf("with TOLLGATE_ADMIN_TOKEN: %v %s", err, out)
	}
}
