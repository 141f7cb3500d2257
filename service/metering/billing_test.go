package metering_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm"
	fsmmeter "github.com/tollgate-io/tollgate/fsm/metering"
	"github.com/tollgate-io/tollgate/nodeport"
	"github.com/tollgate-io/tollgate/service/metering"
)

// stalledLeader is a Metering server on loopback whose GroupSeriesSamples
// never answers: a leader that is alive but stuck.
type stalledLeader struct {
	api.UnimplementedMeteringServer
	release chan struct{}
}

func (l *stalledLeader) GroupSeriesSamples(ctx context.Context, _ *api.GroupSeriesSamplesRequest) (*api.GroupSeriesSamplesResponse, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.release:
		return nil, errors.New("released")
	}
}

// twoGroupHost is a node holding group 0 only; group 1's leader is elsewhere
// (the stalled leader), reached through a real nodeport.Pool.
type twoGroupHost struct {
	mods    []*fsmmeter.Module
	leader1 string
	pool    *nodeport.Pool
}

func (h *twoGroupHost) Groups() int             { return 2 }
func (h *twoGroupHost) GroupOf(hash uint64) int { return int(hash % 2) }
func (h *twoGroupHost) HomeOf(hash uint64) int  { return int(hash % 2) }
func (h *twoGroupHost) Leads(g int) bool        { return false }
func (h *twoGroupHost) Hosts(g int) bool        { return g == 0 }
func (h *twoGroupHost) leaderOf(g int) (string, string) {
	if g == 1 {
		return "stuck", h.leader1
	}
	return "", ""
}
func (h *twoGroupHost) Propose(context.Context, int, byte, []byte) (any, error) {
	return nil, errors.New("no raft in this test")
}
func (h *twoGroupHost) Append(int, byte, []byte) (func(context.Context) (any, error), error) {
	return nil, errors.New("no raft in this test")
}
func (h *twoGroupHost) Module(g int) *fsmmeter.Module             { return h.mods[g] }
func (h *twoGroupHost) TenantsActive(int) []fsmmeter.TenantActive { return nil }
func (h *twoGroupHost) NodeID() string                            { return "n1" }
func (h *twoGroupHost) LeaderConn(ctx context.Context, g int) (*grpc.ClientConn, context.Context, error) {
	return h.pool.Leader(ctx, "n1", g, h.leaderOf)
}
func (h *twoGroupHost) PeerConn(addr string) (*grpc.ClientConn, error) { return h.pool.Conn(addr) }

// TestBillingSummaryStalledGroup: a group whose leader does not answer costs
// the summary its deadline, not the status page; it is named in the errors
// and the groups held here are still billed. With more tenants than the
// bound, the top ones by p95 are listed and the summary says it is
// truncated.
func TestBillingSummaryStalledGroup(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	leader := &stalledLeader{release: make(chan struct{})}
	gs := grpc.NewServer()
	api.RegisterMeteringServer(gs, leader)
	go gs.Serve(lis)
	defer gs.Stop()
	defer close(leader.release)

	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	nowMin := now.UnixMilli() / 60_000
	host := &twoGroupHost{mods: []*fsmmeter.Module{fsmmeter.New(0), fsmmeter.New(1)}, leader1: lis.Addr().String(), pool: nodeport.NewPool(nil, nil)}
	t.Cleanup(host.pool.Close)
	var rows []fsmmeter.TenantActive
	n := metering.MaxBillingTenants + 20
	for i := range n {
		rows = append(rows, fsmmeter.TenantActive{Tenant: fmt.Sprintf("t%03d", i), Active: int64(i)})
	}
	// Last month's samples hold into this month; the counts double at nowMin-9.
	for _, at := range []struct {
		minute int64
		k      int64
	}{{nowMin - 40*24*60, 1}, {nowMin - 9, 2}} {
		scaled := make([]fsmmeter.TenantActive, len(rows))
		for i, r := range rows {
			scaled[i] = fsmmeter.TenantActive{Tenant: r.Tenant, Active: r.Active * at.k}
		}
		if _, err := host.mods[0].Apply(fsm.ModuleEntry{Type: fsmmeter.EntrySeries, Payload: fsmmeter.EncodeSeries(at.minute, scaled)}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := metering.New(metering.Config{TestClock: true}, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := svc.Clock().Set(now.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	sum := svc.BillingSummary(ctx)
	// The call ends at the deadline: the caller's ("deadline exceeded"), or
	// the leader's copy of it, which grpc-go's server enforces by resetting
	// the stream (RST_STREAM CANCEL) and which may arrive first.
	if len(sum.Errors) != 1 || !strings.Contains(sum.Errors[0], "group 1") ||
		!(strings.Contains(sum.Errors[0], "deadline") || strings.Contains(sum.Errors[0], "CANCEL")) {
		t.Fatalf("errors %q, want group 1's deadline", sum.Errors)
	}
	if sum.Month != "2026-11" || sum.TenantsTotal != n || !sum.Truncated || len(sum.Tenants) != metering.MaxBillingTenants {
		t.Fatalf("summary month %s, %d tenants of %d, truncated %v", sum.Month, len(sum.Tenants), sum.TenantsTotal, sum.Truncated)
	}
	// Month to date: minutes since the 1st at 00:00 through now's minute;
	// the last 10 at double the count, under 5% of them, so p95 is the count.
	monthMin := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli() / 60_000
	for i, b := range sum.Tenants {
		k := int64(n - 1 - i) // highest first
		if b.Tenant != fmt.Sprintf("t%03d", k) || b.P95 != k || b.Max != 2*k || int64(b.Minutes) != nowMin+1-monthMin {
			t.Fatalf("row %d: %+v", i, b)
		}
	}
}
