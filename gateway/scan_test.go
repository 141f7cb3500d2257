package gateway

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"google.golang.org/protobuf/encoding/protowire"
)

// fullDecodeV1 is what decode did before scan.go: the generated Unmarshal,
// then labels.Labels.Hash per series.
func fullDecodeV1(t *testing.T, raw []byte) (hashes []uint64, samples []int, metadata bool) {
	t.Helper()
	var req prompb.WriteRequest
	if err := req.Unmarshal(raw); err != nil {
		t.Fatal(err)
	}
	for _, ts := range req.Timeseries {
		sb := labels.NewScratchBuilder(len(ts.Labels))
		for _, l := range ts.Labels {
			sb.Add(l.Name, l.Value)
		}
		hashes = append(hashes, sb.Labels().Hash())
		samples = append(samples, len(ts.Samples)+len(ts.Histograms))
	}
	return hashes, samples, len(req.Metadata) > 0
}

func randomRequest(r *rand.Rand) *prompb.WriteRequest {
	var req prompb.WriteRequest
	for i := range 1 + r.IntN(40) {
		n := 1 + r.IntN(8)
		var ls []prompb.Label
		for j := range n {
			v := fmt.Sprintf("v%d-%d", i, r.IntN(1000))
			switch r.IntN(6) {
			case 0:
				v = strings.Repeat("x", 250+r.IntN(20)) // around the one-byte length's edge
			case 1:
				v = strings.Repeat("é", 1+r.IntN(40000)) // a three-byte length
			case 2:
				v = ""
			}
			ls = append(ls, prompb.Label{Name: fmt.Sprintf("l%02d", j), Value: v})
		}
		ts := prompb.TimeSeries{Labels: ls}
		for range r.IntN(3) {
			ts.Samples = append(ts.Samples, prompb.Sample{Value: r.Float64(), Timestamp: r.Int64()})
		}
		for range r.IntN(2) {
			ts.Histograms = append(ts.Histograms, prompb.Histogram{Timestamp: r.Int64(), Schema: 3, Count: &prompb.Histogram_CountInt{CountInt: 5}})
		}
		if r.IntN(4) == 0 {
			ts.Exemplars = append(ts.Exemplars, prompb.Exemplar{Labels: []prompb.Label{{Name: "trace", Value: "abc"}}, Value: 1})
		}
		req.Timeseries = append(req.Timeseries, ts)
	}
	if r.IntN(3) == 0 {
		req.Metadata = []prompb.MetricMetadata{{MetricFamilyName: "m", Help: "h"}}
	}
	return &req
}

// TestScanMatchesDecode: on random valid requests (label strings short,
// around 255 bytes and over 64 KB; samples, histograms, exemplars,
// metadata; unknown fields added) the scanner gives every series the id,
// and the sample count, that the full decoder and labels.Labels.Hash give.
func TestScanMatchesDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		raw, err := randomRequest(r).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			// An unknown field (99, a varint) at the end of the request.
			raw = protowire.AppendVarint(protowire.AppendTag(raw, 99, protowire.VarintType), 7)
		}
		wantH, wantS, wantM := fullDecodeV1(t, raw)
		b := &batch{proto: protoV1}
		if !scanV1(raw, b) {
			t.Fatalf("request %d: the scanner refused a valid request", i)
		}
		if fmt.Sprint(b.hashes) != fmt.Sprint(wantH) || fmt.Sprint(b.samples) != fmt.Sprint(wantS) || b.metadata != wantM {
			t.Fatalf("request %d: scanned ids %v samples %v metadata %v; full decode %v %v %v", i, b.hashes, b.samples, b.metadata, wantH, wantS, wantM)
		}
		got, err := decode(protoV1, raw)
		if err != nil || got.v1 != nil || got.total != sum(wantS) {
			t.Fatalf("request %d: decode used the full decoder (%v) or counted %d samples, want %d: %v", i, got != nil && got.v1 != nil, got.total, sum(wantS), err)
		}
	}
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

// TestScanRefusesWhatDecodeRefuses: each invalid request is refused by the
// scanner, and decode then answers the full decoder's error, naming the
// problem.
func TestScanRefusesWhatDecodeRefuses(t *testing.T) {
	good := func() *prompb.WriteRequest {
		return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "job", Value: "a"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: 2}},
		}}}
	}
	marshal := func(req *prompb.WriteRequest) []byte {
		raw, err := req.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	cases := map[string]struct {
		raw  []byte
		want string
	}{
		"unsorted":   {marshal(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: []prompb.Label{{Name: "job", Value: "a"}, {Name: "__name__", Value: "up"}}}}}), "not sorted"},
		"duplicate":  {marshal(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: []prompb.Label{{Name: "a", Value: "1"}, {Name: "a", Value: "2"}}}}}), "duplicate label name"},
		"empty name": {marshal(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: []prompb.Label{{Name: "", Value: "1"}}}}}), "empty name"},
		"bad utf-8":  {marshal(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: []prompb.Label{{Name: "a", Value: "\xff"}}}}}), "not valid UTF-8"},
		"no labels":  {marshal(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Samples: []prompb.Sample{{Value: 1}}}}}), "no labels"},
		"truncated":  {marshal(good())[:10], "decode protobuf"},
		"cut sample": {func() []byte {
			// A series whose sample message holds a cut varint.
			var ts []byte
			lab := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "up")
			lab = protowire.AppendString(protowire.AppendTag(lab, 2, protowire.BytesType), "x")
			ts = protowire.AppendBytes(protowire.AppendTag(ts, 1, protowire.BytesType), lab)
			ts = protowire.AppendBytes(protowire.AppendTag(ts, 2, protowire.BytesType), []byte{0x10, 0x80})
			return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ts)
		}(), "decode protobuf"},
		"series as varint": {protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 5), "decode protobuf"},
	}
	for name, c := range cases {
		b := &batch{proto: protoV1}
		if scanV1(c.raw, b) {
			t.Errorf("%s: the scanner accepted it", name)
		}
		_, err := decode(protoV1, c.raw)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: decode error %v, want one naming %q", name, err, c.want)
		}
	}
}

// TestFilterAfterScan: a scanned request whose series are partly dropped
// is decoded in full for the filter, and forwards exactly the others.
func TestFilterAfterScan(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	req := randomRequest(r)
	for len(req.Timeseries) < 3 {
		req = randomRequest(r)
	}
	raw, _ := req.Marshal()
	b, err := decode(protoV1, raw)
	if err != nil {
		t.Fatal(err)
	}
	drop := map[uint64]bool{b.hashes[0]: true}
	body, kept, keptSamples, err := b.filter(drop)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := decompress(body, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	h, s, _ := fullDecodeV1(t, plain)
	wantH, wantS, _ := fullDecodeV1(t, raw)
	var keepH []uint64
	keepS := 0
	for i := range wantH {
		if wantH[i] != wantH[0] {
			keepH = append(keepH, wantH[i])
			keepS += wantS[i]
		}
	}
	if fmt.Sprint(h) != fmt.Sprint(keepH) || kept != len(keepH) || keptSamples != keepS || sum(s) != keepS {
		t.Fatalf("forwarded %v (%d series, %d samples), want %v (%d samples)", h, kept, keptSamples, keepH, keepS)
	}
}
