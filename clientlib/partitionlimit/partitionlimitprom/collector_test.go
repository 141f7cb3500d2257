package partitionlimitprom

import (
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
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
			v := m.GetGauge().GetValue()
			if mf.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			out = append(out, mf.GetName()+"{"+strings.Join(labels, ",")+"} "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	sort.Strings(out)
	return out
}

func TestCollector(t *testing.T) {
	l, err := partitionlimit.New(partitionlimit.Config{Limits: partitionlimit.LimitsFunc(func(tenant string) int64 {
		if tenant == "small" {
			return 10
		}
		return 0
	})})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hs := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		}
		return out
	}
	if err := l.Check("small", []partitionlimit.Series{{Partition: 1, Hashes: hs(5)}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Check("small", []partitionlimit.Series{{Partition: 1, Hashes: hs(100)}}); !errors.Is(err, partitionlimit.ErrLimitExceeded) {
		t.Fatalf("100 series over a limit of 10: %v", err)
	}
	if err := l.Check("small", []partitionlimit.Series{{Partition: -1, Hashes: hs(1)}}); err == nil {
		t.Fatal("partition -1 accepted")
	}
	if err := l.Check("free", []partitionlimit.Series{{Partition: 1, Hashes: hs(100)}}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(l))
	got := strings.Join(gather(t, reg), "\n")
	for _, want := range []string{
		`tollgate_client_partition_limit_checks_total{result=accepted} 1`,
		`tollgate_client_partition_limit_checks_total{result=rejected} 2`,
		`tollgate_client_partition_limit_checks_total{result=unlimited} 1`,
		`tollgate_client_partition_limit_rejected_total{reason=invalid} 1`,
		`tollgate_client_partition_limit_rejected_total{reason=partition_limit} 1`,
		`tollgate_client_partition_limit_remote{state=local-only} 1`,
		`tollgate_client_partition_limit_remote{state=connected} 0`,
		`tollgate_client_partition_limit_pushes_total{result=ok} 0`,
		`tollgate_client_partition_limit_last_push_timestamp_seconds{} 0`,
		`tollgate_client_partition_limit_tenants{} 1`,
		`tollgate_client_partition_limit_partitions{} 1`,
	} {
		if !strings.Contains(got, want+"\n") && !strings.HasSuffix(got, want) {
			t.Errorf("missing %s in\n%s", want, got)
		}
	}
}
