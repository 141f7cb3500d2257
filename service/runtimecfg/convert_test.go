package runtimecfg

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
)

func TestProtoRoundTrip(t *testing.T) {
	d, _, err := runtimecfg.ParseYAML([]byte(`
defaults: {max_series: 10, sample_rates: {locate: 90}}
tenants:
  acme: {ingestion_rate: 2.5, ingestion_burst: 5, max_series_per_partition: 7}
global:
  sample_rates: {submit: 20}
  backlog_controller: {kind: submit, target: 100, period: 250ms, kp: 0.5, ki: 0.1, min_percent: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	d.Version = 6
	back, err := FromProto(ToProto(d))
	if err != nil {
		t.Fatal(err)
	}
	if back.Version != 6 || !runtimecfg.SameContent(d, back) {
		t.Fatalf("round trip changed the document: %+v", back)
	}
	// The wire form is validated like the YAML form, naming the field.
	bad := ToProto(d)
	bad.Tenants["acme"].IngestionBurst = ptr[int64](-1)
	var fe *runtimecfg.FieldError
	if _, err := FromProto(bad); !errors.As(err, &fe) || fe.Field != "tenants.acme.ingestion_burst" {
		t.Fatalf("bad burst: %v", err)
	}
	bad = ToProto(d)
	bad.Global.BacklogController.PeriodMs = 1 << 60 // must not overflow into a valid period
	if _, err := FromProto(bad); !errors.As(err, &fe) || fe.Field != "global.backlog_controller.period" {
		t.Fatalf("huge period: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// Equal requests make equal patches (map order does not leak into the log).
func TestPatchOfIsDeterministic(t *testing.T) {
	req := &api.SetLimitsRequest{Tenant: "acme", Set: map[string]string{"max_series": "5", "ingestion_rate": "1", "ingestion_burst": "2", "sample_rates.a": "3"},
		Unset: []string{"max_series_per_partition"}, Clear: true}
	first, err := patchOf(req)
	if err != nil {
		t.Fatal(err)
	}
	want := string(runtimecfg.AppendPatch(nil, first))
	for range 20 {
		p, _ := patchOf(req)
		if string(runtimecfg.AppendPatch(nil, p)) != want {
			t.Fatal("patch bytes depend on map order")
		}
	}
	if first.Ops[0].Kind != runtimecfg.OpClear || first.Ops[1].Key != "ingestion_burst" {
		t.Fatalf("op order %+v", first.Ops)
	}
	for _, bad := range []*api.SetLimitsRequest{
		{Set: map[string]string{"max_series": "1"}},                              // no scope
		{Tenant: "a", Defaults: true, Set: map[string]string{"max_series": "1"}}, // two scopes
		{Tenant: "a"}, // nothing to do
		{Tenant: "a b", Set: map[string]string{"max_series": "1"}}, // bad tenant
	} {
		if _, err := patchOf(bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v", bad, err)
		}
	}
}
