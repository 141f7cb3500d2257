package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	climeter "github.com/tollgate-io/tollgate/clientlib/metering"
)

// BenchmarkEvents measures start+stop events accepted per second by a real
// three-node cluster on loopback (real raft, fsync off as in the other
// cluster tests), with 128 concurrent gRPC callers spread over the nodes
// (followers forward to the group leader), and the p99 latency of one event.
//
//	go test -run '^$' -bench BenchmarkEvents -benchtime 20000x ./meterserver/
func BenchmarkEvents(b *testing.B) { benchEvents(b, 0) }

// BenchmarkEventsBatch is BenchmarkEvents with the batch call (Events): 16
// callers, each sending 512 events (256 starts, then their 256 stops) per
// call round-robin to the three nodes.
//
//	go test -run '^$' -bench BenchmarkEventsBatch -benchtime 100000x ./meterserver/
func BenchmarkEventsBatch(b *testing.B) { benchEvents(b, 256) }

func benchEvents(b *testing.B, batch int) {
	c := startCluster(b, 3, "", true)
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).UnixMilli()
	for _, s := range c.nodes {
		_ = s.Metering().Clock().Set(now)
	}
	var clients []*climeter.Client
	for _, s := range c.nodes {
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		cl := climeter.New(cc)
		cl.Retries = 100 // leaders move while the cluster balances itself
		clients = append(clients, cl)
	}
	const workers = 128
	if batch > 0 {
		benchBatched(b, c, clients, now, batch)
		return
	}
	var next atomic.Int64
	lat := make([][]time.Duration, workers)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[w%len(clients)]
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				tg := climeter.Target{OrganizationID: "org", SpaceID: "space", ConsumerID: "c", ResourceID: "vm", PlanID: "small", ResourceInstanceID: fmt.Sprint("inst-", i)}
				ev := climeter.Event{ID: fmt.Sprint("s", i), Timestamp: time.UnixMilli(now + 10*60_000), Target: tg, Measures: map[string]float64{"memory": 512}}
				t0 := time.Now()
				if _, err := cl.Start(context.Background(), ev); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				t0 = time.Now()
				if _, err := cl.Stop(context.Background(), climeter.Event{ID: fmt.Sprint("e", i), Timestamp: time.UnixMilli(now + 100*60_000), Target: tg}); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	// The cluster and the callers share this process: events per CPU-second
	// says what the code costs when the machine is shared with other work.
	b.ReportMetric(float64(2*b.N)/cpu.Seconds(), "events/cpu-s")
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	b.ReportMetric(float64(2*b.N)/el.Seconds(), "events/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	}
	// Sampler throughput: every span above runs from now+10m to now+100m
	// (now is an hour boundary), so nothing was due while the events were
	// sent; once the clock passes now+100m each span yields two records.
	t1 := time.Now()
	for _, s := range c.nodes {
		_ = s.Metering().Clock().Advance(3 * time.Hour)
	}
	want := 2 * b.N
	for {
		n := 0
		for _, s := range c.nodes {
			for _, g := range s.Metering().Status().Groups {
				if g.Leader {
					n += g.Records
				}
			}
		}
		if n >= want {
			break
		}
		if time.Since(t1) > 5*time.Minute {
			b.Fatalf("sampler emitted %d of %d records", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(want)/time.Since(t1).Seconds(), "records/s")
}

// benchBatched: b.N spans, each a start and a stop, sent by 16 callers in
// calls of `batch` starts followed by a call with their stops.
func benchBatched(b *testing.B, c *cluster, clients []*climeter.Client, now int64, batch int) {
	const workers = 16
	var next atomic.Int64
	var latMu sync.Mutex
	var lat []time.Duration
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[w%len(clients)]
			for {
				lo := next.Add(int64(batch)) - int64(batch)
				if lo >= int64(b.N) {
					return
				}
				hi := min(lo+int64(batch), int64(b.N))
				starts := make([]climeter.BatchEvent, 0, hi-lo)
				stops := make([]climeter.BatchEvent, 0, hi-lo)
				for i := lo; i < hi; i++ {
					tg := climeter.Target{OrganizationID: "org", SpaceID: "space", ConsumerID: "c", ResourceID: "vm", PlanID: "small", ResourceInstanceID: fmt.Sprint("inst-", i)}
					starts = append(starts, climeter.BatchEvent{Event: climeter.Event{ID: fmt.Sprint("s", i), Timestamp: time.UnixMilli(now + 10*60_000), Target: tg, Measures: map[string]float64{"memory": 512}}})
					stops = append(stops, climeter.BatchEvent{Stop: true, Event: climeter.Event{ID: fmt.Sprint("e", i), Timestamp: time.UnixMilli(now + 100*60_000), Target: tg}})
				}
				for _, evs := range [][]climeter.BatchEvent{starts, stops} {
					t0 := time.Now()
					res, err := cl.Events(context.Background(), evs)
					if err != nil {
						b.Error(err)
						return
					}
					for _, r := range res {
						if r.Err != nil {
							b.Error(r.Err)
							return
						}
					}
					latMu.Lock()
					lat = append(lat, time.Since(t0))
					latMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(2*b.N)/cpu.Seconds(), "events/cpu-s")
	b.ReportMetric(float64(2*b.N)/el.Seconds(), "events/s")
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-call-ms")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-call-ms")
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
