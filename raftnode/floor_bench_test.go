package raftnode

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode/wal"
)

// BenchmarkRaftFloor is the floor of "replicated and durable" under the
// tracker: raw hashicorp/raft, one group, with what a Host gives it (the
// shared log with group commit and its zeros ahead, no pipelining, 256
// entries per AppendEntries, loopback TCP between the nodes) and nothing of
// Tollgate above it: the FSM only counts. Each op is one 8 KB entry (the
// size of a 1,000-series track entry), applied with 8 in flight as the
// tracker pipelines them. It reports the process's CPU per series
// (cpu-ns/series = CPU per entry ÷ 1,000; with nodes=3 the three nodes run in
// this process, so it is their CPU summed, as scripts/bench-cluster.sh sums
// the nodes'): what the end-to-end figures cost beyond replication and
// fsync is Tollgate's.
func BenchmarkRaftFloor(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			leader := floorCluster(b, nodes)
			data := make([]byte, 8<<10)
			for i := range data {
				data[i] = byte(i * 7)
			}
			const inFlight = 8
			cpu0 := processCPU(b)
			b.ResetTimer()
			var wg sync.WaitGroup
			work := make(chan struct{}, inFlight)
			for range inFlight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range work {
						if err := leader.Apply(data, 10*time.Second).Error(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			for b.Loop() {
				work <- struct{}{}
			}
			close(work)
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N)/1000, "cpu-ns/series")
		})
	}
}

// processCPU is the process's user and system CPU so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countFSM applies by counting.
type countFSM struct {
	mu sync.Mutex
	n  int
}

func (f *countFSM) Apply(*raft.Log) any {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	return nil
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return countSnap{}, nil }
func (f *countFSM) Restore(r io.ReadCloser) error       { return r.Close() }

type countSnap struct{}

func (countSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (countSnap) Release()                          {}

// floorCluster starts n raw raft nodes of one group on loopback, each with
// its own shared log (durable), bootstraps them and returns the leader.
func floorCluster(b *testing.B, n int) *raft.Raft {
	b.Helper()
	quiet := newHCLogAdapter(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError, "raft")
	var servers []raft.Server
	type node struct {
		id    raft.ServerID
		trans *raft.NetworkTransport
		logs  raft.LogStore
		snaps raft.SnapshotStore
	}
	nodes := make([]node, n)
	for i := range nodes {
		dir := b.TempDir()
		w, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = w.Close() })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		stream := &tcpStream{ln: ln}
		trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: stream, MaxPool: 3, Timeout: 10 * time.Second, MaxRPCsInFlight: 1, Logger: quiet,
		})
		snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 1, quiet)
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = node{id: raft.ServerID(fmt.Sprintf("n%d", i+1)), trans: trans, logs: w.Group(0), snaps: snaps}
		servers = append(servers, raft.Server{ID: nodes[i].id, Address: trans.LocalAddr()})
	}
	var rafts []*raft.Raft
	for _, nd := range nodes {
		cfg := raft.DefaultConfig()
		cfg.LocalID = nd.id
		cfg.Logger = quiet
		cfg.MaxAppendEntries = DefaultMaxAppendEntries
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
		cfg.ElectionTimeout = DefaultElectionTimeout
		cfg.LeaderLeaseTimeout = DefaultHeartbeatTimeout
		stable := raft.NewInmemStore() // term and vote: written at elections only
		r, err := raft.NewRaft(cfg, &countFSM{}, nd.logs, stable, nd.snaps, nd.trans)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			b.Fatal(err)
		}
		rafts = append(rafts, r)
	}
	b.Cleanup(func() {
		for _, r := range rafts {
			_ = r.Shutdown().Error()
		}
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, r := range rafts {
			if r.State() == raft.Leader {
				return r
			}
		}
	}
	b.Fatal("no leader within 20 s")
	return nil
}

// tcpStream is a raft.StreamLayer over a plain loopback listener.
type tcpStream struct{ ln net.Listener }

func (s *tcpStream) Accept() (net.Conn, error) { return s.ln.Accept() }
func (s *tcpStream) Close() error              { return s.ln.Close() }
func (s *tcpStream) Addr() net.Addr            { return s.ln.Addr() }
func (s *tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}
