package partitionlimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
	"github.com/tollgate-io/tollgate/server"
)

// Example_runtimeConfig takes max_series_per_partition from the cluster's
// replicated runtime configuration: a clientlib.Client is a Limits (its
// MaxSeriesPerPartition reads the newest configuration it received), so a
// change made with `tollgate limits set --tenant team-a
// max_series_per_partition=100` applies to the next Check with no glue code.
// (Do not pass `LimitsFunc(c.RuntimeConfig().MaxSeriesPerPartition)`: that
// binds one fixed version.)
func Example_runtimeConfig() {
	dir, err := os.MkdirTemp("", "tollgate-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.New(server.Config{
		Node:    server.NodeConfig{DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Cluster: server.ClusterConfig{Bootstrap: true},
		Raft:    server.RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(context.Background())
	if err := s.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}
	addrs := []string{s.GRPCAddr()}

	c, err := clientlib.New(clientlib.Config{Addrs: addrs})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	pl, err := partitionlimit.New(partitionlimit.Config{Addrs: addrs, Limits: c})
	if err != nil {
		log.Fatal(err)
	}
	defer pl.Close()

	// What `tollgate limits set --tenant team-a max_series_per_partition=100` does.
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	resp, err := api.NewConfigClient(cc).SetLimits(ctx, &api.SetLimitsRequest{
		Tenant: "team-a", Set: map[string]string{"max_series_per_partition": "100"}})
	if err != nil {
		log.Fatal(err)
	}
	for c.RuntimeConfig().Version() < resp.Version { // the change reaches the client's cluster stream
		time.Sleep(10 * time.Millisecond)
	}

	request := func(first, n int) []partitionlimit.Series {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = uint64(first+i) * 0x9e3779b97f4a7c15
		}
		return []partitionlimit.Series{{Partition: 7, Hashes: hs}}
	}
	fmt.Println("80 series:", pl.Check("team-a", request(0, 80)))
	err = pl.Check("team-a", request(80, 80))
	var le *partitionlimit.LimitError
	if errors.As(err, &le) {
		fmt.Printf("80 more: rejected, tenant %s partition %d limit %d\n", le.Tenant, le.Partition, le.Limit)
	}
	fmt.Println("other tenants (no limit):", pl.Check("team-b", request(0, 1000)))
	// Output:
	// 80 series: <nil>
	// 80 more: rejected, tenant team-a partition 7 limit 100
	// other tenants (no limit): <nil>
}
