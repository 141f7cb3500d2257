package clientlib

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// BenchmarkNearLimitPush measures, on a real three-node cluster, the time from
// a tenant crossing the near-limit fraction on the leader (the write that takes
// it past 85% of its group share has committed there) to every one of 10
// subscribed clients treating that tenant as sync. One op = one crossing; run
// with -benchtime=25x. "stream" is WatchSummaries; "poll" is the same clients
// against Tracker-only proxies of the same nodes (the pre-stream behaviour:
// GetUsersCloseToLimit every NearLimitRefresh = 1s), the baseline.
//
//	go test -run '^$' -bench NearLimitPush -benchtime 25x ./clientlib/
func BenchmarkNearLimitPush(b *testing.B) {
	const p, clients = api.DefaultPartitions, 10
	tc := startCluster(b, 3, 400) // share 100 per group, near from 85
	var reals []string
	for _, s := range tc.nodes {
		reals = append(reals, s.GRPCAddr())
	}
	proxies := startOldTrackers(b, reals...)
	writerCfg := testConfig(reals...)
	writer, err := New(writerCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer writer.Close()
	seq := 0
	for _, mode := range []struct {
		name  string
		addrs []string
	}{{"stream", reals}, {"poll", proxies}} {
		b.Run(mode.name, func(b *testing.B) {
			var cs []*Client
			for range clients {
				cfg := testConfig(mode.addrs...)
				cfg.Mode = ModeAuto
				c, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				cs = append(cs, c)
			}
			known := func() bool {
				for _, c := range cs {
					e := nearEntry(c, 0)
					if !e.known || time.Since(e.at) > c.staleAfter() {
						return false
					}
				}
				return true
			}
			waitTB(b, "every client to know group 0", known)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				seq++
				tenant := fmt.Sprintf("cross-%d", seq)
				b.StopTimer()
				waitTB(b, "fresh lists", known)
				for _, c := range cs {
					if c.isSync(0, tenant) {
						b.Fatalf("%s sync before crossing", tenant)
					}
				}
				b.StartTimer()
				if rej, err := writer.TrackPartition(ctx, tenant, 0, hashesIn(0, p, 86)); err != nil || len(rej) != 0 {
					b.Fatalf("crossing %s: %d rejected, %v", tenant, len(rej), err)
				}
				crossed := time.Now()
				for _, c := range cs {
					for !c.isSync(0, tenant) {
						time.Sleep(200 * time.Microsecond)
					}
				}
				lat = append(lat, time.Since(crossed))
			}
			b.StopTimer()
			slices.Sort(lat)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(lat[len(lat)/2]), "median-ms")
			b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
			b.ReportMetric(ms(lat[0]), "min-ms")
			if mode.name == "stream" {
				var polls uint64
				for _, c := range cs {
					polls += c.Stats().NearLimitPolls
				}
				if polls != 0 {
					b.Errorf("stream clients polled %d times", polls)
				}
			}
		})
	}
}
