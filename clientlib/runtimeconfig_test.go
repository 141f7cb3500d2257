package clientlib

import (
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

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

// A view may carry the config as a delta from the version the stream
// carried last: the client applies it to the config it holds. A delta from a
// version it does not hold makes it reopen the stream (whose first view
// carries the whole config), never guess.
func TestRuntimeConfigDeltaFromWatch(t *testing.T) {
	n := newFakeNode(t)
	cl := newFakeCluster()
	n.setCluster(cl)
	base := &api.RuntimeConfig{Version: 5,
		Defaults: &api.TenantLimits{MaxSeriesPerPartition: ptr[int64](9)},
		Tenants: map[string]*api.TenantLimits{
			"keep":   {MaxSeriesPerPartition: ptr[int64](1)},
			"change": {MaxSeriesPerPartition: ptr[int64](2)},
			"drop":   {MaxSeriesPerPartition: ptr[int64](3)},
		}}
	v := view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfig = 5, base
	cl.set(v)
	c := newTestClient(t, testConfig(n.addr))
	waitFor(t, "config version 5", func() bool { return c.RuntimeConfig().Version() == 5 })

	next := &api.RuntimeConfig{Version: 6,
		Defaults: &api.TenantLimits{MaxSeriesPerPartition: ptr[int64](8)},
		Tenants: map[string]*api.TenantLimits{
			"keep":   {MaxSeriesPerPartition: ptr[int64](1)},
			"change": {MaxSeriesPerPartition: ptr[int64](20)},
			"new":    {MaxSeriesPerPartition: ptr[int64](4)},
		}}
	v = view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfigDelta = 6, api.ConfigDelta(base, next)
	cl.set(v)
	waitFor(t, "config version 6", func() bool { return c.RuntimeConfig().Version() == 6 })
	if got := c.RuntimeConfig().Proto(); !proto.Equal(got, next) {
		t.Fatalf("config after the delta: %v, want %v", got, next)
	}
	r := c.RuntimeConfig()
	if r.MaxSeriesPerPartition("change") != 20 || r.MaxSeriesPerPartition("drop") != 8 || r.MaxSeriesPerPartition("new") != 4 || r.MaxSeriesPerPartition("keep") != 1 {
		t.Fatal("limits after the delta")
	}

	// A delta from version 7, which this client never held.
	reconnects := c.Stats().WatchReconnects
	v = view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfigDelta = 8, &api.RuntimeConfigDelta{BaseVersion: 7, Version: 8}
	cl.set(v)
	waitFor(t, "the stream reopened", func() bool { return c.Stats().WatchReconnects > reconnects })
	if got := c.RuntimeConfig().Version(); got != 6 {
		t.Fatalf("config version %d after a delta from a version not held, want 6 kept", got)
	}
	// The reopened stream's whole config is taken.
	v = view(4, 2, []*fakeNode{n}, []int{0, 0})
	v.ConfigVersion, v.RuntimeConfig = 8, &api.RuntimeConfig{Version: 8}
	cl.set(v)
	waitFor(t, "config version 8", func() bool { return c.RuntimeConfig().Version() == 8 })
}
