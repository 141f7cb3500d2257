package clientlib

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
)

// TestPartitionLimitFromRuntimeConfig: on a real three-node cluster, a
// partitionlimit.Limiter whose Limits is the Client itself enforces the
// max_series_per_partition set through the Config service (what `tollgate
// limits set --tenant acme max_series_per_partition=N` sends), follows a
// later change without being rebuilt, and stops limiting when the key is
// unset. The nodes accept the tenant's sketches once they hold the limit.
func TestPartitionLimitFromRuntimeConfig(t *testing.T) {
	tc := startCluster(t, 3, 0)
	var addrs []string
	for _, s := range tc.nodes {
		addrs = append(addrs, s.GRPCAddr())
	}
	c := newTestClient(t, testConfig(addrs...))
	lim, err := partitionlimit.New(partitionlimit.Config{Addrs: addrs, Limits: c})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	cc, err := grpc.NewClient(addrs[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cfg := api.NewConfigClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	set := func(req *api.SetLimitsRequest, want int64) {
		t.Helper()
		resp, err := cfg.SetLimits(ctx, req)
		for status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			// Right after the start a forward can find group 0 between
			// leaders; an operator's CLI retries the same, and so does this.
			time.Sleep(100 * time.Millisecond)
			resp, err = cfg.SetLimits(ctx, req)
		}
		if err != nil {
			t.Fatalf("set limits %v: %v", req, err)
		}
		waitTB(t, "every node and the client at the new version", func() bool {
			for _, s := range tc.nodes {
				if s.RuntimeConfig().Version < resp.Version || s.TenantLimitsFor("acme").MaxSeriesPerPartition != want {
					return false
				}
			}
			return c.RuntimeConfig().Version() >= resp.Version
		})
		if got := c.MaxSeriesPerPartition("acme"); got != want {
			t.Fatalf("client reads max_series_per_partition %d, want %d", got, want)
		}
	}
	r := rand.New(rand.NewPCG(3, 3))
	series := func(n int) []partitionlimit.Series {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = r.Uint64()
		}
		return []partitionlimit.Series{{Partition: 3, Hashes: hs}}
	}

	// No limit yet: untracked.
	if err := lim.Check("acme", series(2000)); err != nil {
		t.Fatalf("unlimited tenant rejected: %v", err)
	}
	if st := lim.Stats(); st.Unlimited != 1 || st.Tenants != 0 {
		t.Fatalf("unlimited check tracked: %+v", st)
	}

	set(&api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"max_series_per_partition": "1000"}}, 1000)
	var le *partitionlimit.LimitError
	if err := lim.Check("acme", series(2000)); !errors.As(err, &le) || le.Tenant != "acme" || le.Partition != 3 || le.Limit != 1000 || le.Estimate < 1500 {
		t.Fatalf("2,000 series against a limit of 1,000: %v", err)
	}
	if err := lim.Check("acme", series(500)); err != nil {
		t.Fatalf("500 series against a limit of 1,000: %v", err)
	}
	// The nodes know the tenant now: they take its sketches.
	if err := lim.Flush(ctx); err != nil {
		t.Fatalf("push after the limit was set: %v", err)
	}
	if st := lim.Stats(); st.PushRejected != 0 || st.Pushes == 0 {
		t.Fatalf("pushes refused: %+v", st)
	}

	// Raised: the same Limiter follows (500 held + 2,000 ≤ 5,000).
	set(&api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"max_series_per_partition": "5000"}}, 5000)
	if err := lim.Check("acme", series(2000)); err != nil {
		t.Fatalf("2,000 more series against a limit of 5,000: %v", err)
	}
	if err := lim.Check("acme", series(4000)); !errors.As(err, &le) || le.Limit != 5000 {
		t.Fatalf("6,500 series against a limit of 5,000: %v", err)
	}

	// Unset: off again.
	set(&api.SetLimitsRequest{Tenant: "acme", Unset: []string{"max_series_per_partition"}}, 0)
	unlimited := lim.Stats().Unlimited
	if err := lim.Check("acme", series(10000)); err != nil {
		t.Fatalf("after unset: %v", err)
	}
	if st := lim.Stats(); st.Unlimited != unlimited+1 || st.Rejected[partitionlimit.ReasonLimit] != 2 {
		t.Fatalf("stats after unset: %+v", st)
	}
}
