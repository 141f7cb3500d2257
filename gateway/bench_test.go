package gateway

import (
	"fmt"
	"testing"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/prometheus/prompb"
)

// BenchmarkDecode is the gateway's own work on a typical request before any
// network call: snappy, protobuf, label checks and hashes of 500 series.
func BenchmarkDecode(b *testing.B) {
	var ts []prompb.TimeSeries
	for i := range 500 {
		ts = append(ts, prompb.TimeSeries{
			Labels: []prompb.Label{{Name: "__name__", Value: "http_requests_total"}, {Name: "instance", Value: "10.0.0.1:9100"},
				{Name: "job", Value: "api"}, {Name: "method", Value: "GET"}, {Name: "series", Value: fmt.Sprint(i)}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: 1}},
		})
	}
	raw, _ := (&prompb.WriteRequest{Timeseries: ts}).Marshal()
	body := snappy.Encode(nil, raw)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r, err := decompress(body, 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		bt, err := decode(protoV1, r)
		if err != nil {
			b.Fatal(err)
		}
		_ = unique(bt.hashes)
	}
}
