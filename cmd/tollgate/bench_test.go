package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
)

// The summary's counts add up and match their names: sent = new + refresh =
// accepted + rejected + failed, and rejections are split into new and refresh
// by hash.
func TestBenchCountsAddUp(t *testing.T) {
	var c benchCounts
	// 3 new (1, 2, 3) + 2 refreshes (10, 11); 2 and 11 rejected.
	c.record([]uint64{1, 2, 3, 10, 11}, 3, []uint64{2, 11}, nil)
	// All refresh, none rejected.
	c.record([]uint64{10, 10, 12}, 0, nil, nil)
	// A failed request: its series count as sent and failed, nothing else.
	c.record([]uint64{4, 5, 13}, 2, nil, errors.New("unavailable"))
	// A duplicated new hash rejected twice (once per occurrence).
	c.record([]uint64{6, 6}, 2, []uint64{6, 6}, nil)
	s := c.summary(2, []float64{1, 2, 3})
	want := BenchSummary{Requests: 4, RequestsFailed: 1, Sent: 13, New: 7, Refresh: 6, Accepted: 6, Rejected: 4, Failed: 3, NewAccepted: 2, NewRejected: 3}
	got := s
	got.DurationSec, got.SeriesPerSec, got.NewPerSec, got.RefreshPerSec, got.P50Ms, got.P90Ms, got.P99Ms, got.MaxMs = 0, 0, 0, 0, 0, 0, 0, 0
	if got.Requests != want.Requests || got.RequestsFailed != want.RequestsFailed || got.Sent != want.Sent || got.New != want.New ||
		got.Refresh != want.Refresh || got.Accepted != want.Accepted || got.Rejected != want.Rejected || got.Failed != want.Failed ||
		got.NewAccepted != want.NewAccepted || got.NewRejected != want.NewRejected {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if s.Sent != s.New+s.Refresh || s.Sent != s.Accepted+s.Rejected+s.Failed {
		t.Fatalf("counts do not add up: %+v", s)
	}
	// Rates: answered series (accepted + rejected) per second; refreshes
	// answered = 10 answered - 2 new accepted - 3 new rejected = 5.
	if s.SeriesPerSec != 5 || s.NewPerSec != 1 || s.RefreshPerSec != 2.5 {
		t.Fatalf("rates: %v %v %v", s.SeriesPerSec, s.NewPerSec, s.RefreshPerSec)
	}
	if s.P50Ms != 2 || s.MaxMs != 3 {
		t.Fatalf("latency: %v %v", s.P50Ms, s.MaxMs)
	}
}

func TestBenchFailsWhenMostRequestsFail(t *testing.T) {
	for _, tc := range []struct {
		requests, failed int64
		fail             bool
	}{
		{0, 0, true},   // nothing completed
		{5, 5, true},   // no request succeeded
		{10, 6, true},  // most failed
		{10, 5, false}, // half
		{10, 0, false},
	} {
		s := BenchSummary{Requests: tc.requests, RequestsFailed: tc.failed, FirstErrors: []string{"rpc error: code = Unavailable desc = boom"}}
		err := s.failure()
		if (err != nil) != tc.fail {
			t.Errorf("%d of %d failed: err = %v, want failure %v", tc.failed, tc.requests, err, tc.fail)
		}
		if err != nil && tc.requests > 0 && !strings.Contains(err.Error(), "boom") {
			t.Errorf("error does not show the first errors: %v", err)
		}
	}
}

// One second of outcomes: errors are counted by gRPC code and kept out of the
// latency percentiles; the client's counters come in as deltas.
func TestBenchSecond(t *testing.T) {
	var w benchWindow
	for i := 1; i <= 100; i++ {
		w.add(time.Duration(i)*time.Millisecond, nil)
	}
	w.add(time.Hour, status.Error(codes.Unavailable, "down"))
	w.add(time.Hour, status.Error(codes.Unavailable, "down"))
	w.add(time.Hour, &clientlib.PartitionError{Err: status.Error(codes.ResourceExhausted, "slow down")})
	n, errs, lats := w.take()
	bs := benchSecondOf(3, n, errs, lats, statsDelta(clientlib.Stats{Retries: 5, FailedOpen: 1}, clientlib.Stats{Retries: 12, NotLeaderRedirects: 4, FailedOpen: 3}))
	if bs.T != 3 || bs.Requests != 103 || bs.Errors != 3 || bs.ErrorsByCode["Unavailable"] != 2 || bs.ErrorsByCode["ResourceExhausted"] != 1 {
		t.Fatalf("counts: %+v", bs)
	}
	if bs.Retries != 7 || bs.NotLeader != 4 || bs.FailedOpen != 2 {
		t.Fatalf("client deltas: %+v", bs)
	}
	if bs.P99Ms != 100 || bs.MaxMs != 100 {
		t.Fatalf("latency: p99 %v max %v, want 100 100 (errors excluded)", bs.P99Ms, bs.MaxMs)
	}
	if !strings.Contains(bs.line(), "errors=3 (ResourceExhausted:1 Unavailable:2)") {
		t.Fatalf("line: %s", bs.line())
	}
	// The window starts over.
	if n, errs, lats := w.take(); n != 0 || errs != nil || lats != nil {
		t.Fatalf("window not reset: %d %v %v", n, errs, lats)
	}
}

// The pacer's due times follow the schedule exactly (start + k·interval),
// whenever the receiver takes them, and it stops with its context.
func TestBenchPaceFollowsTheSchedule(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	const interval = 3 * time.Millisecond
	out := make(chan time.Time, 4)
	done := make(chan struct{})
	go func() { pace(ctx, start, interval, out); close(done) }()
	for k := range 20 {
		if d := <-out; !d.Equal(start.Add(time.Duration(k) * interval)) {
			t.Fatalf("due time %d: %v after start, want %v", k, d.Sub(start), time.Duration(k)*interval)
		}
		if k == 5 {
			time.Sleep(5 * interval) // a slow receiver: the schedule does not shift
		}
	}
	cancel()
	<-done
}

// Concurrent workers create exactly --series-per-tenant new series between
// them, however the universe divides into requests and partitions (workers
// checked the count and then added a whole request each: 8–17 % over), and
// every request is in the partition it says.
func TestBenchUniverseIsExact(t *testing.T) {
	for _, tc := range []struct {
		series   int64
		fraction float64
	}{{100_000, 0.5}, {12_345, 1}, {999, 0.1}} {
		o := benchOpts{tenants: 2, partitions: 64, requestSize: 1000, newFraction: tc.fraction, seriesPerTenant: tc.series}
		b := &benchState{o: o, created: make([]atomic.Int64, o.tenants), next: make([][]atomic.Int64, o.tenants)}
		for t := range b.next {
			b.next[t] = make([]atomic.Int64, o.partitions)
		}
		var mu sync.Mutex
		newSeen := map[uint64]bool{}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 1))
				for i := 0; i < 400; i++ {
					t0 := i % o.tenants
					hs, nNew, p := b.request(t0, r.IntN(o.partitions), r, nil)
					if nNew > len(hs) {
						panic("more new series than hashes")
					}
					mu.Lock()
					for _, h := range hs[:nNew] {
						if newSeen[h] {
							panic("a new series sent twice")
						}
						newSeen[h] = true
					}
					mu.Unlock()
					for _, h := range hs {
						if got := api.Partition(h, o.partitions); got != p {
							panic(fmt.Sprintf("hash %#x of partition %d in a request for %d", h, got, p))
						}
					}
				}
			}()
		}
		wg.Wait()
		for t0 := range o.tenants {
			if c := b.created[t0].Load(); c != tc.series {
				t.Errorf("series %d, new fraction %v: tenant %d created %d", tc.series, tc.fraction, t0, c)
			}
		}
		if want := int(tc.series) * o.tenants; len(newSeen) != want {
			t.Errorf("series %d: %d distinct new series sent, want %d", tc.series, len(newSeen), want)
		}
	}
}

// --metrics-url entries: a node's host:port or a URL; a URL without a path
// scrapes /metrics; anything else is refused naming the flag.
func TestBenchMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7380":                  "http://127.0.0.1:7380/metrics",
		" http://127.0.0.1:7380/ ":        "http://127.0.0.1:7380/metrics",
		"https://node-a:7380":             "https://node-a:7380/metrics",
		"http://127.0.0.1:7380/x/metrics": "http://127.0.0.1:7380/x/metrics",
	} {
		if got, err := metricsURL(in); err != nil || got != want {
			t.Errorf("metricsURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://h:1", "http://", "http://[::1"} {
		if got, err := metricsURL(bad); err == nil || !strings.Contains(err.Error(), "--metrics-url") {
			t.Errorf("metricsURL(%q) = %q, %v; want an error naming --metrics-url", bad, got, err)
		}
	}
	if _, err := newCostProbe([]string{"127.0.0.1:7380", "http://127.0.0.1:7380/metrics"}, nil, time.Second); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("the same node twice: %v, want an error (its CPU would count twice)", err)
	}
}

// The cost is each node's CPU growth, summed, per series sent.
func TestBenchCostArithmetic(t *testing.T) {
	t0 := time.Now()
	a := cpuSnapshot{at: t0, cpu: []float64{10, 3}}
	b := cpuSnapshot{at: t0.Add(2 * time.Second), cpu: []float64{11.5, 3.5}}
	c := benchCost([]string{"u1", "u2"}, a, b, 1_000_000)
	if c.CPUSeconds != 2 || c.NsPerSeries != 2000 || c.CPUCores != 1 || c.IntervalSecs != 2 || c.Series != 1_000_000 {
		t.Fatalf("total: %+v", c)
	}
	if len(c.Nodes) != 2 || c.Nodes[0] != (NodeCost{"u1", 1.5, 1500}) || c.Nodes[1] != (NodeCost{"u2", 0.5, 500}) {
		t.Fatalf("nodes: %+v", c.Nodes)
	}
	if c := benchCost([]string{"u1"}, a, b, 0); c.NsPerSeries != 0 || c.Nodes[0].NsPerSeries != 0 {
		t.Fatalf("no series: %+v", c)
	}
}
