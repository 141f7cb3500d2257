package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// TestTrackByLayoutTable: on one node, a table moving partition 31 from
// group 1 to group 3 is applied through group 0's log. A request routed to
// group 1 then gets Unavailable with a Moved detail and decides nothing; one
// routed to group 3, and one that names no group (clients before the table),
// is decided by group 3. The table survives a restart (group 0's log and
// snapshot).
func TestTrackByLayoutTable(t *testing.T) {
	dir := t.TempDir()
	s, tc := startServer(t, dir, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const part = 31
	lo, _ := api.PartitionHashRange(part, 64)
	moved := api.ArithmeticTable(64, 4).Move(part, 3)
	if e, err := s.ProposeLayout(ctx, moved); err != nil || e != 1 {
		t.Fatalf("propose: %d %v", e, err)
	}
	one, three := uint32(1), uint32(3)
	_, err := tc.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: "t", Partition: part, Hashes: []uint64{lo}, Group: &one})
	st, _ := status.FromError(err)
	var mv *api.Moved
	for _, d := range st.Details() {
		if m, ok := d.(*api.Moved); ok {
			mv = m
		}
	}
	if st.Code() != codes.Unavailable || mv == nil || mv.Group != 3 || mv.LayoutEpoch != 1 || mv.LeaderId != "n1" {
		t.Fatalf("routed to the old owner: %v (detail %v), want Unavailable with Moved to group 3", err, mv)
	}
	if s.FSM(1).TenantActive("t") != 0 || s.FSM(3).TenantActive("t") != 0 {
		t.Fatal("a Moved answer recorded a series")
	}
	if _, err := tc.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: "t", Partition: part, Hashes: []uint64{lo}, Group: &three}); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.TrackSeries(ctx, &api.TrackSeriesRequest{Tenant: "t", Partition: part, Hashes: []uint64{lo + 1}}); err != nil {
		t.Fatal(err)
	}
	if a1, a3 := s.FSM(1).TenantActive("t"), s.FSM(3).TenantActive("t"); a1 != 0 || a3 != 2 {
		t.Fatalf("active series: group 1 %d, group 3 %d; want 0 and 2", a1, a3)
	}
	near, err := tc.GetUsersCloseToLimit(ctx, &api.GetUsersCloseToLimitRequest{Partition: part})
	if err != nil || near.Group != 3 {
		t.Fatalf("near-limit read of partition %d: group %d %v, want group 3", part, near.GetGroup(), err)
	}
	stop(t, s)
	s2, _ := startServer(t, dir, nil)
	defer stop(t, s2)
	if cur := s2.layout.Module().Current(); !cur.Equal(moved) {
		t.Fatalf("after a restart the table is %+v, want the moved one", cur)
	}
}
