package ratelimit

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// BenchmarkAbsorbRound is one report period of 1,000 clients × 1,000 tenants
// on one owner: decode 1,000 wire reports (proto.Unmarshal), absorb them, tick
// (fold, decide, build 1,000 updates) and encode the updates. One op = one
// 100 ms round, so ns/op ÷ 1e8 is the share of one core the node spends; the
// cpu-ms/round metric is process CPU time (user+sys) per round, measured
// around the owner's work only.
//
// Reports are what a client sends in steady state: bucket counts only when a
// tenant joins the stream (first report), unless fullReports (the protocol
// before bucket counts became optional; the baseline build sets it).
//
// Worst case on purpose: every client reports every tenant every round with
// new counts (the clients' reports are encoded between rounds, timer
// stopped), so nothing the owner skips for "unchanged" entries helps here.
func BenchmarkAbsorbRound(b *testing.B) {
	const clients, tenants = 1000, 1000
	o := mustNew(b, Config{}, 64, 4, func(string) (float64, int64) { return 1e6, 0 })
	now := time.Unix(1_800_000_000, 0)
	sess := make([]*Session, clients)
	wire := make([][]byte, clients)
	mk := func(c int, round uint64, first bool) *api.RateReport {
		r := &api.RateReport{ClientId: uint64(c + 1), Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}
		for t := range tenants {
			id := uint32(t + 1)
			if first {
				r.NewIds = append(r.NewIds, id)
				r.NewNames = append(r.NewNames, fmt.Sprintf("tenant-%04d", t))
			}
			r.Ids = append(r.Ids, id)
			v := round*100 + uint64(t)
			r.ConsumedTotal = append(r.ConsumedTotal, v)
			r.OfferedTotal = append(r.OfferedTotal, v+round)
			if first || fullReports {
				r.BucketStartUnixNanos = append(r.BucketStartUnixNanos, now.UnixNano())
				r.BucketConsumed = append(r.BucketConsumed, v)
				r.PrevBucketConsumed = append(r.PrevBucketConsumed, 0)
			}
		}
		return r
	}
	all := func(int) bool { return true }
	none := func(int) (string, string) { return "", "" }
	for c := range clients {
		sess[c] = o.NewSession()
		if err := sess[c].Absorb(mk(c, 0, true), now); err != nil {
			b.Fatal(err)
		}
	}
	o.Tick(now, all, none)
	for c := range clients {
		sess[c].Take()
	}
	encode := func(round uint64) {
		for c := range clients {
			wire[c], _ = proto.Marshal(mk(c, round, false))
		}
	}
	var cpu time.Duration
	var outBytes int
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		encode(uint64(i + 1))
		runtime.GC() // the encoding's garbage is not the owner's cost
		b.StartTimer()
		c0 := rusage()
		now = now.Add(100 * time.Millisecond)
		for c := range clients {
			var r api.RateReport
			if err := proto.Unmarshal(wire[c], &r); err != nil {
				b.Fatal(err)
			}
			if err := sess[c].Absorb(&r, now); err != nil {
				b.Fatal(err)
			}
		}
		o.Tick(now, all, none)
		for c := range clients {
			u := sess[c].Take()
			buf, err := proto.Marshal(u)
			if err != nil {
				b.Fatal(err)
			}
			outBytes += len(buf)
			recycle(sess[c], u)
		}
		cpu += rusage() - c0
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/round")
	b.ReportMetric(float64(len(wire[0])), "report-bytes")
	b.ReportMetric(float64(outBytes)/float64(b.N*clients), "update-bytes")
}

// BenchmarkTick is one tick of an owner that owns every tenant, each
// reported by 2 of 64 Lease clients with new counts every period: fold
// the reports, decide, build the 64 updates. One shard (the tick on one
// goroutine) against the default (one per core). Reports are absorbed and
// the updates taken with the timer stopped: one op = one Tick.
func BenchmarkTick(b *testing.B) {
	for _, tenants := range []int{10_000, 100_000} {
		for _, shards := range []int{1, 0} {
			name := fmt.Sprintf("tenants=%d/shards=%d", tenants, shards)
			if shards == 0 {
				name = fmt.Sprintf("tenants=%d/shards=default(%d)", tenants, min(runtime.GOMAXPROCS(0), DefaultMaxShards))
			}
			b.Run(name, func(b *testing.B) { benchTick(b, tenants, shards) })
		}
	}
}

func benchTick(b *testing.B, tenants, shards int) {
	const clients, perTenant = 64, 2
	o := mustNew(b, Config{Shards: shards}, 64, 4, func(string) (float64, int64) { return 1e6, 0 })
	now := time.Unix(1_800_000_000, 0)
	sess := make([]*Session, clients)
	reps := make([]*api.RateReport, clients)
	for c := range clients {
		sess[c] = o.NewSession()
		reps[c] = &api.RateReport{ClientId: uint64(c + 1), Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}
	}
	for j := range tenants {
		for k := range perTenant {
			r := reps[(j+k)%clients]
			id := uint32(len(r.Ids) + 1)
			r.NewIds = append(r.NewIds, id)
			r.NewNames = append(r.NewNames, fmt.Sprintf("tenant-%06d", j))
			r.Ids = append(r.Ids, id)
			r.ConsumedTotal = append(r.ConsumedTotal, 0)
			r.OfferedTotal = append(r.OfferedTotal, 0)
			r.BucketStartUnixNanos = append(r.BucketStartUnixNanos, now.UnixNano())
			r.BucketConsumed = append(r.BucketConsumed, 0)
			r.PrevBucketConsumed = append(r.PrevBucketConsumed, 0)
		}
	}
	all := func(int) bool { return true }
	none := func(int) (string, string) { return "", "" }
	absorb := func() {
		for c, r := range reps {
			if err := sess[c].Absorb(r, now); err != nil {
				b.Fatal(err)
			}
		}
	}
	take := func() {
		for _, s := range sess {
			if u := s.Take(); u != nil {
				s.Recycle(u)
			}
		}
	}
	absorb()
	o.Tick(now, all, none)
	take()
	for _, r := range reps { // steady state: counts only
		r.NewIds, r.NewNames, r.BucketStartUnixNanos, r.BucketConsumed, r.PrevBucketConsumed = nil, nil, nil, nil, nil
	}
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		now = now.Add(100 * time.Millisecond)
		for _, r := range reps {
			for x := range r.ConsumedTotal {
				r.ConsumedTotal[x] += uint64(1 + (i+x)%50)
				r.OfferedTotal[x] += uint64(2 + (i+x)%70)
			}
		}
		absorb()
		b.StartTimer()
		c0 := rusage()
		o.Tick(now, all, none)
		cpu += rusage() - c0
		b.StopTimer()
		take()
		b.StartTimer()
	}
	// Process CPU (user+sys) per tick: against ns/op, how much of the
	// sharded tick's time ran on more than one core.
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/tick")
}

func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
