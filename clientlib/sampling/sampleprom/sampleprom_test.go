package sampleprom

import (
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-io/tollgate/clientlib/sampling"
)

// gather flattens a registry into "name{l1=v1,l2=v2} value" lines, sorted.
func gather(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out = append(out, mf.GetName()+"{"+strings.Join(labels, ",")+"} "+value(mf.GetType(), m))
		}
	}
	sort.Strings(out)
	return out
}

func value(typ dto.MetricType, m *dto.Metric) string {
	v := m.GetGauge().GetValue()
	if typ == dto.MetricType_COUNTER {
		v = m.GetCounter().GetValue()
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func TestCollector(t *testing.T) {
	s := sampling.New(sampling.Options{MaxKeys: 4})
	if err := s.Update(sampling.Rates{Version: 7,
		Global: map[string]float64{"locate": 0},
		Keys:   map[string]map[string]float64{"t1": {"submit": 100}}}); err != nil {
		t.Fatal(err)
	}
	_ = s.Update(sampling.Rates{Version: 3}) // stale: refused
	for range 5 {
		s.ShouldSample("t1", "locate") // global 0%: dropped
		s.ShouldSample("t1", "submit") // 100%: sampled
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(s))
	got := strings.Join(gather(t, reg), "\n")
	want := strings.Join([]string{
		"tollgate_client_sample_config_updates_total{result=applied} 1",
		"tollgate_client_sample_config_updates_total{result=refused} 1",
		"tollgate_client_sample_config_version{} 7",
		"tollgate_client_sample_decisions_total{decision=dropped,kind=locate} 5",
		"tollgate_client_sample_decisions_total{decision=dropped,kind=submit} 0",
		"tollgate_client_sample_decisions_total{decision=sampled,kind=locate} 0",
		"tollgate_client_sample_decisions_total{decision=sampled,kind=submit} 5",
		"tollgate_client_sample_global_percent{kind=locate} 0",
		"tollgate_client_sample_key_decisions_total{decision=dropped,key=t1,kind=locate} 5",
		"tollgate_client_sample_key_decisions_total{decision=dropped,key=t1,kind=submit} 0",
		"tollgate_client_sample_key_decisions_total{decision=sampled,key=t1,kind=locate} 0",
		"tollgate_client_sample_key_decisions_total{decision=sampled,key=t1,kind=submit} 5",
	}, "\n")
	if got != want {
		t.Fatalf("metrics:\n%s\nwant:\n%s", got, want)
	}
}
