package ratelimit

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// TestTenantBudgetPerClient: over real gRPC on loopback, the tenant names
// one client's open Sync streams introduce are bounded together: a second
// stream that would pass the bound ends with ResourceExhausted naming it,
// and the budget comes back when the first stream closes. (Many streams of
// 100,000 names each once held 73 MB apiece without bound.)
func TestTenantBudgetPerClient(t *testing.T) {
	svc, err := NewService(ServiceConfig{
		Owns:                func(int) bool { return true },
		LeaderOf:            func(int) (string, string) { return "", "" },
		ClientOf:            func(context.Context) string { return "credential c" },
		MaxTenantsPerClient: 100,
	}, 64, 4, func(string) (float64, int64) { return 0, 0 })
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	api.RegisterRateLimitServer(gs, svc)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(client uint64, n int) (grpc.BidiStreamingClient[api.RateReport, api.RateUpdate], context.CancelFunc) {
		sctx, scancel := context.WithCancel(ctx)
		st, err := api.NewRateLimitClient(cc).Sync(sctx)
		if err != nil {
			t.Fatal(err)
		}
		r := &api.RateReport{ClientId: client, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE}
		for i := range n {
			r.NewIds = append(r.NewIds, uint32(i+1))
			r.NewNames = append(r.NewNames, fmt.Sprintf("t%d", i))
		}
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
		return st, scancel
	}
	first, closeFirst := open(1, 80)
	waitBudget := func(want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			svc.budgetMu.Lock()
			got := svc.budget["credential c"]
			svc.budgetMu.Unlock()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("budget %d, want %d", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitBudget(80)
	second, closeSecond := open(2, 30)
	defer closeSecond()
	_, err = second.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 100") {
		t.Fatalf("second stream past the client's bound: %v, want ResourceExhausted naming it", err)
	}
	_ = first
	closeFirst()
	waitBudget(0)
	third, closeThird := open(3, 30)
	defer closeThird()
	waitBudget(30)
	_ = third
}
