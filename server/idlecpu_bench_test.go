package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkIdleCPUByTenants measures the CPU an idle single-node cluster
// uses with a 10-tenant and with a 100,000-tenant runtime config, one after
// the other in the same run, and reports both (percent of one core) and
// their ratio. Run:
//
//	go test ./server -run '^$' -bench IdleCPUByTenants -benchtime 1x
func BenchmarkIdleCPUByTenants(b *testing.B) {
	for b.Loop() {
		small := idleCPU(b, 10)
		big := idleCPU(b, 100_000)
		b.ReportMetric(small, "%core@10")
		b.ReportMetric(big, "%core@100k")
		b.ReportMetric(big/max(small, 0.01), "ratio")
	}
}

// idleCPU starts a node whose limits file (proposed as the runtime config)
// holds n tenants, waits until the config is in its cluster view and the
// node has settled, and returns the process CPU over 10 s as percent of one
// core.
func idleCPU(b *testing.B, n int) float64 {
	var sb strings.Builder
	sb.WriteString("tenants:\n")
	for i := range n {
		fmt.Fprintf(&sb, "  tenant-%06d:\n    max_series: %d\n", i, 1000+i)
	}
	lf := filepath.Join(b.TempDir(), "limits.yaml")
	if err := os.WriteFile(lf, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{
		Node:    NodeConfig{ID: "n1", DataDir: b.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Cluster: ClusterConfig{Bootstrap: true},
		Raft:    RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Limits:  LimitsConfig{File: lf},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Stop(context.Background()) }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		// In the view, and in every group (replication of the document to
		// groups 1..3 is start-up work, not idleness: on a loaded machine it
		// can outlast the settling below).
		if v, _ := s.view.get(); v != nil && len(v.GetRuntimeConfig().GetTenants()) == n && allGroupsAt(s, v.GetRuntimeConfig().GetVersion()) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d-tenant config not in the view", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // let start-up work and GC settle
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const window = 10 * time.Second
	c0, t0 := cpu(), time.Now()
	time.Sleep(window)
	return 100 * float64(cpu()-c0) / float64(time.Since(t0))
}

// allGroupsAt reports whether every group's runtime config module holds
// version v.
func allGroupsAt(s *Server, v uint64) bool {
	for g := range s.cfg.Layout.Groups {
		if m := s.rcfg.Module(g); m == nil || m.Current().Version != v {
			return false
		}
	}
	return true
}
