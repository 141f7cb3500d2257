package clientlib

import (
	"math"
	"sync"
	"testing"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/clientlib/sampling"
)

// FeedSampler brings each newer config version into the sampler; a version
// the sampler refuses keeps the previous rates and is reported.
func TestFeedSampler(t *testing.T) {
	n := newFakeNode(t)
	cl := newFakeCluster()
	n.setCluster(cl)
	push := func(cfg *api.RuntimeConfig) {
		v := view(4, 2, []*fakeNode{n}, []int{0, 0})
		v.ConfigVersion, v.RuntimeConfig = cfg.Version, cfg
		cl.set(v)
	}
	push(&api.RuntimeConfig{Version: 2, Global: &api.GlobalConfig{SampleRates: map[string]float64{"locate": 50}},
		Defaults: &api.TenantLimits{SampleRates: map[string]float64{"submit": 80}},
		Tenants: map[string]*api.TenantLimits{"acme": {SampleRates: map[string]float64{"locate": 40}},
			"plain": {MaxSeries: ptr[int64](5)}}})
	c := newTestClient(t, testConfig(n.addr))
	s := sampling.New(sampling.Options{})
	var mu sync.Mutex
	var refused []uint64
	stop := c.FeedSampler(s, func(v uint64, err error) {
		mu.Lock()
		refused = append(refused, v)
		mu.Unlock()
	})
	defer stop()
	waitFor(t, "sampler at version 2", func() bool { return s.Version() == 2 })
	for _, c := range []struct {
		key, kind string
		want      float64
	}{{"acme", "locate", 20}, {"other", "locate", 50}, {"acme", "submit", 80}, {"plain", "other", 100}} {
		if got := s.Rate(c.key, c.kind); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Rate(%s, %s) = %v, want %v", c.key, c.kind, got, c.want)
		}
	}
	if r := c.RuntimeConfig().SamplingRates(); len(r.Keys) != 1 || r.Keys["acme"]["locate"] != 40 {
		t.Errorf("tenants without sample rates should be left out: %+v", r.Keys)
	}

	// A view the sampler refuses (a kind with a dot, which no valid config
	// holds; a broken or hostile server could send it): version 3 is
	// reported and version 2's rates stay.
	push(&api.RuntimeConfig{Version: 3, Global: &api.GlobalConfig{SampleRates: map[string]float64{"9.locate": 10}}})
	waitFor(t, "version 3 reported as refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(refused) == 1 && refused[0] == 3
	})
	if s.Version() != 2 || s.Rate("other", "locate") != 50 {
		t.Fatalf("refused version changed the sampler: version %d", s.Version())
	}
	push(&api.RuntimeConfig{Version: 4, Global: &api.GlobalConfig{SampleRates: map[string]float64{"locate": 10}}})
	waitFor(t, "sampler at version 4", func() bool { return s.Version() == 4 })
	if got := s.Rate("acme", "locate"); math.Abs(got-10) > 1e-9 {
		t.Fatalf("after version 4: %v, want 10", got)
	}
	stop()
	push(&api.RuntimeConfig{Version: 5, Global: &api.GlobalConfig{SampleRates: map[string]float64{"locate": 1}}})
	waitFor(t, "client at version 5", func() bool { return c.RuntimeConfig().Version() == 5 })
	if s.Version() != 4 {
		t.Fatalf("stopped feed still updated the sampler to %d", s.Version())
	}
}
