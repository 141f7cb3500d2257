package raftnode

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tollgate-io/tollgate/raftnode/wal"
	"github.com/tollgate-io/tollgate/raftnode/wal/powerfs"
)

// TestSlowDisk: under load, the shared log of the node leading the most
// groups starts taking 2 s per fsync (powerfs.SetSyncDelay; the other two
// disks stay fast). Every group it leads must be led by another node
// within 5 s (asserted with TOLLGATE_SLOWDISK_BAR=1; always within 30 s),
// and the history of the load must check against the final
// logs (nothing acknowledged lost, see checkPowerHistory). In-process nodes
// on real TCP: the delay needs the test file layer under the log.
func TestSlowDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault test (loaded 3-node cluster, power cuts or a 2 s fsync); make test runs it, -short (make test-fast) does not")
	}
	const G, N, clients = 3, 3, 4
	disks := map[string]*powerfs.FS{}
	testWALOptions = func(dataDir string, o *wal.Options) {
		if d, ok := disks[dataDir]; ok {
			o.FS = d
		}
	}
	t.Cleanup(func() { testWALOptions = nil })
	hosts := make([]*Host, N)
	fsms := make([][]*sumFSM, N)
	for i := range hosts {
		dir := t.TempDir()
		disks[dir] = powerfs.New()
		fsms[i] = newFSMs(G)
		hosts[i] = mustNew(t, Config{NodeID: fmt.Sprintf("node-%d", i+1), DataDir: dir, BindAddr: "127.0.0.1:0", Groups: G,
			Logger: testLogger(t, slog.LevelError+4)}, fsms[i])
	}
	servers := make([]raft.Server, N)
	for i, h := range hosts {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: h.NodeID(), Address: h.Addr()}
	}
	if err := hosts[0].BootstrapCluster(servers); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		waitReady(t, h, 45*time.Second)
	}

	epoch := time.Now()
	var mu sync.Mutex
	var ops []powerOp
	var worst time.Duration // longest time a client waited for an acknowledgement
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				g := int(seq) % G
				var leader *Host
				for _, h := range hosts {
					if h.Raft(g).State() == raft.Leader {
						leader = h
					}
				}
				if leader == nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				op := powerOp{g: g, v: uint64(c+1)<<40 | seq, call: time.Since(epoch)}
				f := leader.Raft(g).Apply(cmd(op.v), 10*time.Second)
				err := f.Error()
				op.ret = time.Since(epoch)
				if s, ok := f.Response().(uint64); err == nil && ok {
					op.ok, op.sum = true, s
				} else if err != nil {
					op.err = err.Error()
				}
				mu.Lock()
				ops = append(ops, op)
				if op.ok {
					worst = max(worst, op.ret-op.call)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)

	led := func(h *Host) []int {
		var gs []int
		for g := range G {
			if h.Raft(g).State() == raft.Leader {
				gs = append(gs, g)
			}
		}
		return gs
	}
	slow := 0
	for i, h := range hosts {
		if len(led(h)) > len(led(hosts[slow])) {
			slow = i
		}
	}
	before := led(hosts[slow])
	if len(before) == 0 {
		t.Fatal("no node leads a group")
	}
	mu.Lock()
	worstBefore := worst
	worst = 0
	mu.Unlock()
	disks[hosts[slow].cfg.DataDir].SetSyncDelay(2 * time.Second)
	slowAt := time.Now()
	for len(led(hosts[slow])) > 0 {
		if time.Since(slowAt) > 30*time.Second {
			t.Fatalf("%s still leads groups %v 30 s after its fsync went to 2 s", hosts[slow].NodeID(), led(hosts[slow]))
		}
		time.Sleep(20 * time.Millisecond)
	}
	left := time.Since(slowAt)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	disks[hosts[slow].cfg.DataDir].SetSyncDelay(0)

	final := make([][]uint64, G)
	for g := range G {
		applyRetry(t, hosts, g, cmd(0), 30*time.Second)
		eventually(t, 60*time.Second, fmt.Sprintf("group %d converged", g), func() bool {
			a := fsms[0][g].values()
			return slices.Equal(a, fsms[1][g].values()) && slices.Equal(a, fsms[2][g].values())
		})
		final[g] = slices.DeleteFunc(fsms[0][g].values(), func(v uint64) bool { return v == 0 })
	}
	violations := checkPowerHistory(ops, final)
	for i, v := range violations {
		if i == 20 {
			break
		}
		t.Error(v)
	}
	acked := 0
	for _, op := range ops {
		if op.ok {
			acked++
		}
	}
	t.Logf("%s led groups %v; its fsync went to 2 s and it led none %v later; longest acknowledgement wait %v before, %v after; %d appends (%d acknowledged): %d violations",
		hosts[slow].NodeID(), before, left.Round(time.Millisecond), worstBefore.Round(time.Millisecond), worst.Round(time.Millisecond), len(ops), acked, len(violations))
	// The 5 s bar is a timing: checked when asked for (a loaded machine
	// stretches it); the 30 s bound above always holds.
	if left > 5*time.Second && os.Getenv("TOLLGATE_SLOWDISK_BAR") != "" {
		t.Errorf("leadership left the slow node after %v, want within 5 s", left.Round(time.Millisecond))
	}
}
