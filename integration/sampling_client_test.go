package integration

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/sampling"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

const samplingToken = "s3cret"

// TestSamplingRatesReachClientSampler: a global and a tenant percentage set
// through the Config service on one node reach the sampler of a client
// connected to another, over its cluster stream: 50% × 40% = 20%, and the
// sampler's item decisions follow that rate.
func TestSamplingRatesReachClientSampler(t *testing.T) {
	c := servertest.Start(t, servertest.Options{Nodes: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.Access.AdminToken = samplingToken
	}})
	cc, err := grpc.NewClient(c.Node(0).GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cfg := api.NewConfigClient(cc)

	cl, err := clientlib.New(clientlib.Config{Addrs: []string{c.Node(2).GRPCAddr()}, Token: samplingToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	smp := sampling.New(sampling.Options{})
	stop := cl.FeedSampler(smp, func(v uint64, err error) { t.Errorf("sampler refused version %d: %v", v, err) })
	defer stop()

	set := func(req *api.SetLimitsRequest) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+samplingToken)
		_, err := cfg.SetLimits(ctx, req)
		for status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond) // group 0 between leaders: retry, as the CLI does
			_, err = cfg.SetLimits(ctx, req)
		}
		if err != nil {
			t.Fatalf("set %v: %v", req, err)
		}
	}
	set(&api.SetLimitsRequest{Global: true, Set: map[string]string{"sample_rates.locate": "50"}})
	set(&api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"sample_rates.locate": "40"}})

	for deadline := time.Now().Add(30 * time.Second); math.Abs(smp.Rate("acme", "locate")-20) > 1e-9; {
		if time.Now().After(deadline) {
			t.Fatalf("acme's locate rate in the client's sampler: %v, want 20", smp.Rate("acme", "locate"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := smp.Rate("other", "locate"); r != 50 {
		t.Fatalf("another tenant's locate rate %v, want the global 50", r)
	}
	if r := smp.Rate("acme", "submit"); r != 100 {
		t.Fatalf("an unconfigured kind: %v, want 100", r)
	}
	// Deterministic item decisions follow the same rate: over 20,000 item
	// hashes about 20% are kept.
	kept := 0
	for i := range uint64(20000) {
		if smp.ShouldSampleItem("acme", "locate", i) {
			kept++
		}
	}
	if kept < 3600 || kept > 4400 {
		t.Fatalf("%d of 20000 items kept at 20%%", kept)
	}
}
