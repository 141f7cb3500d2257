package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/server"
)

// envoybench against a real node through the CLI's own command tree: the
// closed loop's counts add up and it reads the server side's CPU from both
// /proc and the node's metrics; the boundary bursts count what the node
// admitted; bad flags are refused naming the flag.
func TestEnvoyBenchAgainstANode(t *testing.T) {
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
	file := filepath.Join(t.TempDir(), "bench.yaml")
	yaml := "domain: bench\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n" +
		"  - key: edge_m\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run("limits", "apply-envoy", "-f", file); err != nil {
		t.Fatalf("apply-envoy: %v\n%s", err, out)
	}

	// This process is the node: its CPU counts once from /proc and once from
	// the node's metrics, so there are two parts.
	out, err := run("envoybench", "--descriptor", "api=ingest", "--concurrency", "4", "--conns", "2",
		"--warmup", "100ms", "--duration", "300ms", "--pid", strconv.Itoa(os.Getpid()), "--metrics-url", s.HTTPAddr(), "--json")
	if err != nil {
		t.Fatalf("closed loop: %v\n%s", err, out)
	}
	var r EnvoyBenchResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// What is under test is the tool's counting: every call is OK or over
	// the limit, and nearly all are OK against a rule of a million a
	// second. A few may be refused while the cold key's first lease is on
	// its way on a loaded machine (the node admits only budget its owner
	// granted), so "all OK" would test the machine.
	if r.Mode != "closed" || r.Calls == 0 || r.Errors != 0 || r.OK+r.OverLimit != r.Calls || r.OverLimit*10 > r.Calls {
		t.Fatalf("closed loop counts: %+v", r)
	}
	if len(r.ServerCPUParts) != 2 || r.ServerCPU <= 0 || r.PerCPUSecond <= 0 || r.P50us <= 0 || r.P99us < r.P50us {
		t.Fatalf("closed loop cost and latency: %+v", r)
	}

	// 40 calls 0.9 s before and 40 0.9 s after a 2 s boundary, against a
	// rule of 20 a minute (the 2 s only places the bursts; a minute's rule
	// keeps the answer exact whatever the machine's speed): the tool counts
	// what the node admitted, some and at most the limit. A machine too slow
	// to answer the first burst within 0.9 s is told so by the tool (its own
	// check), and the test tries again with a fresh counter.
	var b *BoundaryResult
	for try := range 3 {
		out, err = run("envoybench", "--descriptor", fmt.Sprintf("edge_m=t%d", try), "--boundary", "2s", "--offset", "900ms",
			"--limit", "20", "--burst", "40", "--json")
		if err != nil && strings.Contains(err.Error(), "first burst ended") {
			continue
		}
		if err != nil {
			t.Fatalf("boundary: %v\n%s", err, out)
		}
		r = EnvoyBenchResult{}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		b = r.Boundary
		break
	}
	if b == nil {
		t.Fatalf("boundary: no try answered the first burst before the boundary: %v", err)
	}
	if r.Errors != 0 || b.Burst != 40 || b.BeforeOK+b.AfterOK == 0 || b.BeforeOK+b.AfterOK > 20 ||
		b.Admitted != float64(b.BeforeOK+b.AfterOK)/20 {
		t.Fatalf("boundary: %+v %+v", r, b)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--descriptor", "noequals"}, "--descriptor"},
		{[]string{"--boundary", "1s"}, "--limit"},
		{[]string{"--boundary", "1s", "--limit", "5", "--offset", "600ms"}, "--offset"},
		{[]string{"--pid", "-3"}, "--pid"},
		{[]string{"--conns", "0"}, "--conns"},
	} {
		if out, err := run(append([]string{"envoybench"}, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error naming %s\n%s", tc.args, err, tc.want, out)
		}
	}
}

// procCPU reads this process's CPU, which grows as it works.
func TestProcCPU(t *testing.T) {
	a, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for b := a; b <= a; {
		for i := range 10_000_000 {
			x += i
		}
		if b, err = procCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := procCPU(1 << 30); err == nil || !strings.Contains(err.Error(), "--pid") {
		t.Fatalf("a process that does not exist: %v", err)
	}
	_ = x
}
