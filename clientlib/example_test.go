package clientlib_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/server"
)

// Example starts a single-node Tollgate server in process (64 partitions in 4
// raft groups; every tenant may hold 64 series, so 16 in each group) and tracks
// series through the client.
func Example() {
	dir, err := os.MkdirTemp("", "tollgate-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.New(server.Config{
		Node:     server.NodeConfig{DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Cluster:  server.ClusterConfig{Bootstrap: true},
		Raft:     server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Tracking: server.TrackingConfig{DefaultMaxSeries: 64},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(context.Background())
	if err := s.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}

	// The layout (partitions, groups) and the group leaders are learned from
	// the cluster. ModeSync waits for every answer, so the output below is
	// exact; distributors usually keep the default ModeAuto.
	c, err := clientlib.New(clientlib.Config{Addrs: []string{s.GRPCAddr()}, Mode: clientlib.ModeSync})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The tenant may hold 64 active series in all. Shares of that limit move
	// to the groups where the tenant's series land, so 40 new series in two
	// partitions (groups 0 and 3) are all accepted.
	series := func(partition, n int) []uint64 {
		first, _ := api.PartitionHashRange(partition, api.DefaultPartitions)
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = first + uint64(i)
		}
		return hs
	}
	a, b := series(0, 20), series(63, 20)
	rejected, err := c.TrackSeries(ctx, "team-a", slices.Concat(b, a))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent 40, rejected", len(rejected))

	// 40 more in two other partitions: exactly 24 fit under the limit.
	more := slices.Concat(series(1, 20), series(62, 20))
	rejected, err = c.TrackSeries(ctx, "team-a", more)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent 40 more, rejected", len(rejected))

	// Re-sending accepted series never rejects them.
	var accepted []uint64
	for _, h := range more {
		if !slices.Contains(rejected, h) {
			accepted = append(accepted, h)
		}
	}
	rejected, err = c.TrackSeries(ctx, "team-a", slices.Concat(a, b, accepted))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("re-sent 64, rejected", len(rejected))

	p, g := c.Layout()
	fmt.Printf("layout: %d partitions, %d groups; %d requests sent\n", p, g, c.Stats().Requests)
	// Output:
	// sent 40, rejected 0
	// sent 40 more, rejected 16
	// re-sent 64, rejected 0
	// layout: 64 partitions, 4 groups; 8 requests sent
}
