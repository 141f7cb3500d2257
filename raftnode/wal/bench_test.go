package wal

import (
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// BenchmarkAppend: G groups each appending one 8 KB entry at a time (the
// size of a 1,000-series track entry), fsync on, on the test's temp dir:
// the shared log against one raft-boltdb store per group, which is what the
// shared log replaced. One op is one entry of one group.
func BenchmarkAppend(b *testing.B) {
	data := make([]byte, 8<<10)
	for _, groups := range []int{1, 4} {
		b.Run(fmt.Sprintf("shared-wal/groups=%d", groups), func(b *testing.B) {
			w, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			stores := make([]raft.LogStore, groups)
			for g := range stores {
				stores[g] = w.Group(uint16(g))
			}
			appendAll(b, stores, data)
			st := w.Stats()
			b.ReportMetric(float64(st.Requests)/float64(st.Rounds), "appends/fsync")
		})
		b.Run(fmt.Sprintf("boltdb-per-group/groups=%d", groups), func(b *testing.B) {
			dir := b.TempDir()
			stores := make([]raft.LogStore, groups)
			for g := range stores {
				s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, fmt.Sprintf("raft-%d.db", g))})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				stores[g] = s
			}
			appendAll(b, stores, data)
		})
	}
}

func appendAll(b *testing.B, stores []raft.LogStore, data []byte) {
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/len(stores) + 1
	for _, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= per; i++ {
				if err := s.StoreLog(&raft.Log{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: data}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkZeroAhead: one group appending one 8 KB entry per round (each a
// write and an fdatasync), with the zeros written ahead (the default) and
// without (every round grows the file, so its fdatasync also commits the
// new length). Besides the wall time per round it reports the process's
// CPU per round (getrusage: the kernel's share of the fdatasync included)
// and how many rounds grew the file.
func BenchmarkZeroAhead(b *testing.B) {
	data := make([]byte, 8<<10)
	for _, c := range []struct {
		name  string
		ahead int64
	}{{"off", -1}, {"256KB", 0}} {
		b.Run(c.name, func(b *testing.B) {
			w, err := Open(b.TempDir(), Options{ZeroAhead: c.ahead})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			g := w.Group(0)
			var ru0, ru1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			i := uint64(0)
			for b.Loop() {
				i++
				if err := g.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data}); err != nil {
					b.Fatal(err)
				}
			}
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			st := w.Stats()
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(st.Rounds), "cpu-ns/round")
			b.ReportMetric(float64(st.GrowingRounds)/float64(st.Rounds), "growing/round")
		})
	}
}
