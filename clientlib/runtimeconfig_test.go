package clientlib

import (
	"sync"
	"testing"

	"github.com/tollgate-io/tollgate/api"
)

func ptr[T any](v T) *T { return &v }

// The configuration arrives on the watch stream; subscribers see each newer
// version once, in order; a view holding an older version (a lagging node)
// does not move the client back.
func TestRuntimeConfigFromWatch(t *testing.T) {
	n := newFakeNode(t)
	cl := newFakeCluster()
	n.setCluster(cl)
	v := view(4, 2, []*fakeNode{n}, []int{0, 0})
	cl.set(v)
	c := newTestClient(t, testConfig(n.addr))
	if got := c.RuntimeConfig().Version(); got != 0 {
		t.Fatalf("version before any config: %d", got)
	}
	var mu sync.Mutex
	var seen []uint64
	unsub := c.OnRuntimeConfig(func(r *RuntimeConfig) {
		mu.Lock()
		seen = append(seen, r.Version())
		mu.Unlock()
	})
	defer unsub()

	cfg := &api.RuntimeConfig{Version: 3,
		Defaults: &api.TenantLimits{IngestionRate: ptr(10.0), IngestionBurst: ptr[int64](20), SampleRates: map[string]float64{"locate": 50}},
		Tenants: map[string]*api.TenantLimits{"acme": {IngestionRate: ptr(1000.0), MaxSeriesPerPartition: ptr[int64](500),
			SampleRates: map[string]float64{"submit": 5}}},
		Global: &api.GlobalConfig{SampleRates: map[string]float64{"locate": 40}}}
	v = view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfig = 3, cfg
	cl.set(v)
	waitFor(t, "config version 3", func() bool { return c.RuntimeConfig().Version() == 3 })

	r := c.RuntimeConfig()
	if rate, burst := r.IngestionRate("acme"); rate != 1000 || burst != 20 {
		t.Errorf("acme rate %v burst %d (burst inherits the defaults)", rate, burst)
	}
	if rate, _ := r.IngestionRate("other"); rate != 10 {
		t.Errorf("other rate %v", rate)
	}
	if r.MaxSeriesPerPartition("acme") != 500 || r.MaxSeriesPerPartition("other") != 0 {
		t.Error("max_series_per_partition")
	}
	if r.SampleRate("acme", "submit") != 5 || r.SampleRate("acme", "locate") != 50 || r.SampleRate("x", "other") != 100 {
		t.Error("sample rates")
	}
	if r.GlobalSampleRate("locate") != 40 || r.GlobalSampleRate("submit") != 100 {
		t.Error("global sample rates")
	}

	// An older version (e.g. a lagging node's view) is ignored. (The view
	// also loses group 1's leader, so the test can tell it arrived.)
	v = view(4, 2, []*fakeNode{n}, []int{0, -1})
	v.ConfigVersion, v.RuntimeConfig = 2, &api.RuntimeConfig{Version: 2}
	v.ServedBy = "lagging"
	cl.set(v)
	waitFor(t, "the lagging view", func() bool { return c.Leaders()[1] == "" })
	if got := c.RuntimeConfig().Version(); got != 3 {
		t.Fatalf("went back to version %d", got)
	}
	v = view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfig = 4, &api.RuntimeConfig{Version: 4}
	cl.set(v)
	waitFor(t, "config version 4", func() bool { return c.RuntimeConfig().Version() == 4 })

	// A late subscriber gets the current version at once.
	var late uint64
	c.OnRuntimeConfig(func(r *RuntimeConfig) { late = r.Version() })()
	mu.Lock()
	defer mu.Unlock()
	if late != 4 || len(seen) != 2 || seen[0] != 3 || seen[1] != 4 {
		t.Fatalf("subscriber saw %v, late subscriber %d", seen, late)
	}
	if st := c.Stats(); st.ConfigUpdates != 2 || st.ConfigVersion != 4 {
		t.Fatalf("stats %+v", st)
	}
}
