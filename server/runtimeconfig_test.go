package server

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// A limit set through the Config service is what the leader enforces (the
// group's replica), what /api/v1/tenants shows and what the cluster view
// carries; an invalid set changes nothing.
func TestRuntimeConfigDrivesDecisionsAndHTTP(t *testing.T) {
	// Static shares: the test reads one group's share off the limit.
	s, c := startServer(t, filepath.Join(t.TempDir(), "data"), staticShares)
	defer stop(t, s)
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cfg := api.NewConfigClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// max_series 8 → group share ceil(8·16/64) = 2.
	resp, err := cfg.SetLimits(ctx, &api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"max_series": "8"}})
	if err != nil || resp.Version != 1 || resp.GroupsAtVersion != 4 {
		t.Fatalf("set: %v %+v", err, resp)
	}
	// Status reads its own writes: no wait for the cluster loop's next view.
	st, err := api.NewAdminClient(cc).Status(ctx, &api.StatusRequest{})
	if err != nil || st.ConfigVersion != 1 || st.View.GetConfigVersion() != 1 {
		t.Fatalf("status right after set: %v config_version=%d view=%d", err, st.GetConfigVersion(), st.GetView().GetConfigVersion())
	}
	for _, gs := range st.Nodes[0].Groups {
		if gs.ConfigVersion != 1 {
			t.Fatalf("group %d replica reports config version %d after every group acknowledged 1", gs.Group, gs.ConfigVersion)
		}
	}
	if rej := track(t, c, "acme", 0, hashesIn(1, 0, 5)); len(rej) != 3 {
		t.Fatalf("share 2: %d of 5 rejected, want 3", len(rej))
	}
	code, body := get(t, s, "/api/v1/tenants/acme")
	var u TenantUsage
	if code != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil || u.MaxSeries != 8 {
		t.Fatalf("/api/v1/tenants/acme: %d %s", code, body)
	}
	// The cluster view is rebuilt by the node's cluster loop: wait for it.
	waitFor(t, "config in the cluster view", func() bool {
		v, _ := s.view.get()
		return v != nil && v.ConfigVersion == 1 && v.RuntimeConfig.GetTenants()["acme"].GetMaxSeries() == 8
	})

	_, err = cfg.SetLimits(ctx, &api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"max_series": "100", "ingestion_rate": "-1"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid set: %v", err)
	}
	if got := s.groupLimits(0).For("acme").MaxSeries; got != 8 || s.RuntimeConfig().Version != 1 {
		t.Fatalf("invalid set changed the config: max_series %d version %d", got, s.RuntimeConfig().Version)
	}
	if li := s.EffectiveLimits(); li.ConfigVersion != 1 || li.Overrides != 1 {
		t.Fatalf("EffectiveLimits %+v", li)
	}
}
