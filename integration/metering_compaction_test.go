package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/metering/interval"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/service/metering"
)

// TestClosedMonthBillAcrossCompaction: a node records a tenant's active
// series through the last minutes of October; once the group's clock is in
// November the samples of October are compacted (the replica's sample
// memory drops), and October's bill is the one computed from the samples at
// full resolution — also after a raft snapshot and a restart that restores
// from it, where the restored replica holds the same compacted bytes. (The
// dates are before this test was written: a test clock days ahead of the
// wall clock is not what nodes run with.)
func TestClosedMonthBillAcrossCompaction(t *testing.T) {
	dir := t.TempDir()
	cfg := server.Config{
		Node: server.NodeConfig{
			ID:       "n1",
			Zone:     "zone-a",
			DataDir:  dir,
			GRPCAddr: "127.0.0.1:0",
			HTTPAddr: "127.0.0.1:0",
		},
		Cluster:  server.ClusterConfig{Bootstrap: true},
		Raft:     server.RaftConfig{NoSync: true, Addr: "127.0.0.1:0"},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Metering: metering.Config{Granularity: interval.Hour, TestClock: true},
	}
	start := func() *server.Server {
		s, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := s.WaitReady(ctx); err != nil {
			_ = s.Stop(context.Background())
			t.Fatal(err)
		}
		return s
	}
	stop := func(s *server.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s := start()
	c := &cluster{t: t, nodes: []*server.Server{s}}
	t0 := time.Date(2026, 10, 31, 23, 40, 0, 0, time.UTC).UnixMilli()
	c.setClock(t0)
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tr := api.NewTrackerClient(cc)
	base := "http://" + s.HTTPAddr()
	total := 0
	for minute := range 12 {
		// A batch of series a minute in every group, of varying size (the
		// series stay active: the count only grows, and its last 5% of
		// minutes, the p95, are at the total).
		for p := range 4 {
			part := p * 16
			first, _ := api.PartitionHashRange(part, 64)
			var hs []uint64
			for j := range 5 + (minute*7)%11 {
				hs = append(hs, first+uint64(minute*100+j))
			}
			resp, err := tr.TrackSeries(context.Background(), &api.TrackSeriesRequest{Tenant: "acme", Partition: uint32(part), Hashes: hs})
			if err != nil || len(resp.RejectedHashes) != 0 {
				t.Fatalf("track: %v, %d rejected", err, len(resp.GetRejectedHashes()))
			}
			total += len(hs)
		}
		c.advance(time.Minute)
		waitSample(t, base, t0, int64(total))
	}
	// Each group's housekeeping appended the switch that makes dedup records
	// keep their target's hash (a partition move needs it) without moving
	// the group's time: October stays the open month (checked below).
	for g := range 4 {
		if m, ok := s.FSM(g).Module(fsmmeter.Name).(*fsmmeter.Module); !ok || !m.Hashes() {
			t.Fatalf("group %d: the metering switch was not applied", g)
		}
	}
	// The last October minute: every minute of the month is billed, and
	// the month is still open, so nothing is compacted yet.
	c.setClock(time.Date(2026, 10, 31, 23, 59, 30, 0, time.UTC).UnixMilli())
	octFrom := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	octTo := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	// The month's bill, and a window of a few minutes inside it (bills of
	// any window stay exact: compaction keeps every sample).
	partFrom, partTo := t0+4*60_000, t0+9*60_000
	bill := func(s *server.Server) [2]metering.Bill {
		var b [2]metering.Bill
		getJSON(t, fmt.Sprintf("http://%s/v1/usage/bill?tenant=acme&from=%d&to=%d", s.HTTPAddr(), octFrom, octTo), &b[0])
		getJSON(t, fmt.Sprintf("http://%s/v1/usage/bill?tenant=acme&from=%d&to=%d", s.HTTPAddr(), partFrom, partTo), &b[1])
		return b
	}
	seriesBytes := func(s *server.Server) (per [4]int) {
		for _, g := range s.Metering().Status().Groups {
			per[g.Group] = g.SeriesBytes
		}
		return per
	}
	full := bill(s)
	if full[0].Max != int64(total) || full[0].Minutes < 19 || full[0].P95 != full[0].Max ||
		full[1].Minutes != 5 || full[1].P95 != full[1].Max || full[1].Max >= int64(total) {
		t.Fatalf("October at full resolution: %+v (total %d)", full, total)
	}
	before := seriesBytes(s)

	// November on the group's clock: the next housekeeping tick carries it
	// and every replica compacts October when it applies that entry.
	c.setClock(time.Date(2026, 11, 1, 0, 5, 0, 0, time.UTC).UnixMilli())
	var after [4]int
	deadline := time.Now().Add(60 * time.Second) // catches hangs only
	for {
		after = seriesBytes(s)
		smaller := true
		for g := range after {
			smaller = smaller && before[g] > 0 && after[g] < before[g]
		}
		if smaller {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("series bytes per group %v before November, %v since: October not compacted", before, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := bill(s); got != full {
		t.Fatalf("October after compaction %+v, at full resolution %+v", got, full)
	}
	t.Logf("series bytes per group: %v at full resolution, %v compacted; bill %+v", before, after, full)

	// A raft snapshot of every group (the compacted state written as the
	// section), then a restart that restores from it.
	for g := range 4 {
		if err := s.Raft(g).Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
	}
	stop(s)
	s = start()
	defer stop(s)
	c.nodes[0] = s
	c.setClock(time.Date(2026, 11, 1, 0, 5, 0, 0, time.UTC).UnixMilli())
	if got := bill(s); got != full {
		t.Fatalf("October after restoring the snapshot %+v, at full resolution %+v", got, full)
	}
	if got := seriesBytes(s); got != after {
		t.Fatalf("series bytes per group after the restore %v, before it %v", got, after)
	}
}
