package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
)

// TestRWBenchCountsWhatTheReceiverGot: the samples rwbench reports as
// answered 2xx are the samples a receiver decoded, every series' timestamps
// only increase (a Prometheus receiver would refuse out-of-order samples),
// and the tenant header is set.
func TestRWBenchCountsWhatTheReceiverGot(t *testing.T) {
	var mu sync.Mutex
	got, last := 0, map[string]int64{}
	bad := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		raw, err := snappy.Decode(nil, body)
		var req prompb.WriteRequest
		if err == nil {
			err = req.Unmarshal(raw)
		}
		if err != nil || r.Header.Get("X-Scope-OrgID") == "" {
			http.Error(w, "bad", 400)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, ts := range req.Timeseries {
			k := ""
			for _, l := range ts.Labels {
				k += l.Name + "=" + l.Value + ","
			}
			if ts.Samples[0].Timestamp <= last[k] {
				bad++
			}
			last[k] = ts.Samples[0].Timestamp
			got++
		}
		w.WriteHeader(204)
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runRWBench(context.Background(), &out, rwbenchOpts{url: srv.URL, baseline: srv.URL + "/other", tenants: 2, seriesPerTenant: 300,
		seriesPerRequest: 100, concurrency: 3, duration: 300 * time.Millisecond, rounds: 2, tenantHeader: "X-Scope-OrgID",
		requestTimeout: 5 * time.Second, metricName: "m", asJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Runs []rwbenchResult
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, r := range res.Runs {
		sum += r.Samples
	}
	mu.Lock()
	defer mu.Unlock()
	if len(res.Runs) != 4 || sum == 0 || sum != int64(got) || bad != 0 {
		t.Fatalf("%d runs reported %d samples; the receiver decoded %d, %d out of order", len(res.Runs), sum, got, bad)
	}
}

// TestRWSinkCountsSeriesAndSamples: rwbench through the sink: the sink's
// samples equal what rwbench reports, its distinct series what was sent.
func TestRWSinkCountsSeriesAndSamples(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newRWSink("X-Scope-OrgID", reg)
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/write", s.serve)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var out bytes.Buffer
	err := runRWBench(context.Background(), &out, rwbenchOpts{url: srv.URL + "/api/v1/write", tenants: 2, seriesPerTenant: 300,
		seriesPerRequest: 100, concurrency: 2, duration: 300 * time.Millisecond, rounds: 1, tenantHeader: "X-Scope-OrgID",
		requestTimeout: 5 * time.Second, metricName: "m", asJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var res struct{ Runs []rwbenchResult }
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res.Runs) != 1 {
		t.Fatalf("%v %s", err, out.String())
	}
	samples := testutil.ToFloat64(s.samples.WithLabelValues("rwbench-0")) + testutil.ToFloat64(s.samples.WithLabelValues("rwbench-1"))
	if int64(samples) != res.Runs[0].Samples {
		t.Fatalf("sink counted %v samples, rwbench %d", samples, res.Runs[0].Samples)
	}
	if res.Runs[0].Samples >= 600 { // every series sent at least once
		for _, tenant := range []string{"rwbench-0", "rwbench-1"} {
			if n := testutil.ToFloat64(s.distinct.WithLabelValues(tenant)); n != 300 {
				t.Errorf("tenant %s: %v distinct series, want 300", tenant, n)
			}
		}
	}
}
