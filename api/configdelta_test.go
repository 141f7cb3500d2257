package api

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
)

func randomConfig(r *rand.Rand, version uint64, tenants int) *RuntimeConfig {
	c := &RuntimeConfig{Version: version}
	if r.IntN(2) == 0 {
		c.Defaults = &TenantLimits{MaxSeries: proto.Int64(int64(r.IntN(5) * 1000))}
	}
	if r.IntN(2) == 0 {
		c.Global = &GlobalConfig{SampleRates: map[string]float64{"logs": float64(r.IntN(100))}}
	}
	for range tenants {
		name := fmt.Sprintf("t%d", r.IntN(2*tenants+1))
		if c.Tenants == nil {
			c.Tenants = map[string]*TenantLimits{}
		}
		tl := &TenantLimits{MaxSeries: proto.Int64(int64(r.IntN(3)))}
		if r.IntN(3) == 0 {
			tl.SampleRates = map[string]float64{"traces": float64(r.IntN(3))}
		}
		c.Tenants[name] = tl
	}
	return c
}

// TestConfigDeltaRoundTrip: base + Delta(base, next) is next, for random
// pairs (tenants added, changed, removed, defaults and global set or not),
// and the delta lists only tenants that differ.
func TestConfigDeltaRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		base := randomConfig(r, uint64(i+1), r.IntN(20))
		next := randomConfig(r, uint64(i+2), r.IntN(20))
		d := ConfigDelta(base, next)
		got, err := ApplyConfigDelta(base, d)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, next) {
			t.Fatalf("case %d: base %v\n+ delta %v\n= %v\nwant %v", i, base, d, got, next)
		}
		for name, tl := range d.Tenants {
			if old, ok := base.Tenants[name]; ok && proto.Equal(old, tl) {
				t.Fatalf("case %d: delta carries unchanged tenant %s", i, name)
			}
		}
		// The wire round trip too.
		b, err := proto.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var d2 RuntimeConfigDelta
		if err := proto.Unmarshal(b, &d2); err != nil {
			t.Fatal(err)
		}
		if got2, err := ApplyConfigDelta(base, &d2); err != nil || !proto.Equal(got2, next) {
			t.Fatalf("case %d: after the wire: %v, %v", i, got2, err)
		}
	}
}

func TestConfigDeltaSizeIsTheChange(t *testing.T) {
	base := &RuntimeConfig{Version: 7, Tenants: map[string]*TenantLimits{}}
	for i := range 100_000 {
		base.Tenants[fmt.Sprintf("tenant-%06d", i)] = &TenantLimits{MaxSeries: proto.Int64(int64(i))}
	}
	next := proto.Clone(base).(*RuntimeConfig)
	next.Version = 8
	next.Tenants["tenant-000042"] = &TenantLimits{MaxSeries: proto.Int64(1)}
	delete(next.Tenants, "tenant-000043")
	d := ConfigDelta(base, next)
	if len(d.Tenants) != 1 || len(d.RemovedTenants) != 1 || d.RemovedTenants[0] != "tenant-000043" {
		t.Fatalf("delta %v: want tenant-000042 changed and tenant-000043 removed", d)
	}
	full, delta := proto.Size(next), proto.Size(d)
	t.Logf("100,000 tenants, one changed and one removed: full config %d bytes, delta %d bytes", full, delta)
	if delta > 100 {
		t.Fatalf("delta of one change is %d bytes", delta)
	}
}

func TestApplyConfigDeltaRefusesAnotherBase(t *testing.T) {
	base := &RuntimeConfig{Version: 3}
	if _, err := ApplyConfigDelta(base, &RuntimeConfigDelta{BaseVersion: 2, Version: 4}); err == nil {
		t.Fatal("a delta from version 2 applied to version 3")
	}
	if _, err := ApplyConfigDelta(base, &RuntimeConfigDelta{BaseVersion: 3, Version: 3}); err == nil {
		t.Fatal("a delta that does not raise the version applied")
	}
	if _, err := ApplyConfigDelta(base, &RuntimeConfigDelta{BaseVersion: 3, Version: 5}); err != nil {
		t.Fatalf("a delta from the held version: %v", err)
	}
}
