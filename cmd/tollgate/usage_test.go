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
	"github.com/tollgate-io/tollgate/meterserver"
	"github.com/tollgate-io/tollgate/server"
)

// TestUsageCommands runs `tollgate usage query` and `usage bill` against a
// real single-node server whose metering clock the test drives.
func TestUsageCommands(t *testing.T) {
	s, err := server.New(server.Config{DataDir: t.TempDir(), NodeID: "n1", Bootstrap: true, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		RaftAddr: "127.0.0.1:0", RaftNoSync: true, Metering: meterserver.Config{Granularity: interval.Hour, TestClock: true}})
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
