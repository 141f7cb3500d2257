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
		DataDir: dir, Bootstrap: true,
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", RaftAddr: "127.0.0.1:0", RaftNoSync: true,
		DefaultMaxSeries: 64,
		Logger:           slog.New(slog.DiscardHandler),
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

	// 20 new series in partition 0 (group 0) and 20 in partition 63 (group 3).
	series := func(partition int) []uint64 {
		first, _ := api.PartitionHashRange(partition, api.DefaultPartitions)
		hs := make([]uint64, 20)
		for i := range hs {
			hs[i] = first + uint64(i)
		}
		return hs
	}
	a, b := series(0), series(63)
	rejected, err := c.TrackSeries(ctx, "team-a", slices.Concat(b, a))
	if err != nil {
		log.Fatal(err)
	}
	// Each group accepts the first 16 in request order; the rejections come
	// back grouped by partition.
	fmt.Println("sent 40, rejected", len(rejected))
	fmt.Println("rejected = last 4 of each partition:", slices.Equal(rejected, slices.Concat(a[16:], b[16:])))

	// Re-sending accepted series never rejects them.
	rejected, err = c.TrackSeries(ctx, "team-a", slices.Concat(a[:16], b[:16]))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("re-sent 32, rejected", len(rejected))

	p, g := c.Layout()
	fmt.Printf("layout: %d partitions, %d groups; %d requests sent\n", p, g, c.Stats().Requests)
	// Output:
	// sent 40, rejected 8
	// rejected = last 4 of each partition: true
	// re-sent 32, rejected 0
	// layout: 64 partitions, 4 groups; 4 requests sent
}
