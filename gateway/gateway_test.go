package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/tollgate-io/tollgate/clientlib"
	"github.com/tollgate-io/tollgate/clientlib/partitionlimit"
	"github.com/tollgate-io/tollgate/clientlib/ratelimit"
	"github.com/tollgate-io/tollgate/gateway"
	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/server/servertest"
)

// receiver is a remote-write backend on loopback: it decodes what it gets
// (1.0 or 2.0) and keeps every series' labels with the samples it received.
type receiver struct {
	srv      *httptest.Server
	status   atomic.Int32 // answer; 0 = 204
	block    chan struct{}
	mu       sync.Mutex
	series   map[string]int // labels → samples
	requests int
	headers  []http.Header
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{series: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) url() string { return r.srv.URL + "/api/v1/write" }

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if b := r.block; b != nil {
		<-b
	}
	body, _ := io.ReadAll(req.Body)
	raw, err := snappy.Decode(nil, body)
	if err != nil {
		http.Error(w, "receiver: snappy: "+err.Error(), 400)
		return
	}
	_, params, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	got := map[string]int{}
	written := 0
	if params["proto"] == "io.prometheus.write.v2.Request" {
		var m writev2.Request
		if err := m.Unmarshal(raw); err != nil {
			http.Error(w, "receiver: "+err.Error(), 400)
			return
		}
		for _, ts := range m.Timeseries {
			b := labels.NewScratchBuilder(0)
			ls, err := ts.ToLabels(&b, m.Symbols)
			if err != nil {
				http.Error(w, "receiver: "+err.Error(), 400)
				return
			}
			got[ls.String()] += len(ts.Samples)
			written += len(ts.Samples)
		}
	} else {
		var m prompb.WriteRequest
		if err := m.Unmarshal(raw); err != nil {
			http.Error(w, "receiver: "+err.Error(), 400)
			return
		}
		for _, ts := range m.Timeseries {
			b := labels.NewScratchBuilder(0)
			got[ts.ToLabels(&b, nil).String()] += len(ts.Samples)
		}
	}
	r.mu.Lock()
	r.requests++
	r.headers = append(r.headers, req.Header.Clone())
	if s := r.status.Load(); s != 0 {
		r.mu.Unlock()
		http.Error(w, "receiver: told to fail", int(s))
		return
	}
	for k, v := range got {
		r.series[k] += v
	}
	r.mu.Unlock()
	w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", fmt.Sprint(written))
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) snapshot() (series map[string]int, requests int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.series {
		out[k] = v
	}
	return out, r.requests
}

// startTollgate starts a one-node dev server with limitsYAML and a client
// that knows its layout and runtime config.
func startTollgate(t *testing.T, limitsYAML string) (*servertest.Cluster, *clientlib.Client) {
	t.Helper()
	lf := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(lf, []byte(limitsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cl := servertest.Start(t, servertest.Options{Nodes: 1, Configure: func(_ int, cfg *server.Config) { cfg.Limits.File = lf }})
	c, err := clientlib.New(clientlib.Config{Addrs: cl.GRPCAddrs(), Mode: clientlib.ModeSync, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for c.RuntimeConfig().Version() == 0 { // the limits file becomes version 1
		if ctx.Err() != nil {
			t.Fatal("no runtime config from the limits file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cl, c
}

func limitsOf(c *clientlib.Client) func(string) gateway.Limits {
	return func(tenant string) gateway.Limits {
		l := c.RuntimeConfig().Tenant(tenant)
		return gateway.Limits{MaxSeries: l.MaxSeries, IngestionRate: l.IngestionRate, Burst: l.IngestionBurst}
	}
}

func newGateway(t *testing.T, cfg gateway.Config) (*gateway.Gateway, *httptest.Server) {
	t.Helper()
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return g, srv
}

// series i of a family: {__name__="m", job="j", n="i"} and one sample.
func seriesV1(name string, from, to int) []prompb.TimeSeries {
	var out []prompb.TimeSeries
	for i := from; i < to; i++ {
		out = append(out, prompb.TimeSeries{
			Labels:  []prompb.Label{{Name: "__name__", Value: name}, {Name: "job", Value: "j"}, {Name: "n", Value: fmt.Sprint(i)}},
			Samples: []prompb.Sample{{Value: float64(i), Timestamp: 1000}},
		})
	}
	return out
}

func encodeV1(t *testing.T, ts []prompb.TimeSeries) []byte {
	t.Helper()
	raw, err := (&prompb.WriteRequest{Timeseries: ts}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return snappy.Encode(nil, raw)
}

// post sends a remote-write body and returns the answer's code and text.
func post(t *testing.T, url, tenant, contentType string, body []byte) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType == "" {
		contentType = "application/x-protobuf"
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	if tenant != "" {
		req.Header.Set("X-Scope-OrgID", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg), resp.Header
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestSeriesLimit: a tenant under its limit loses nothing and its body is
// forwarded; a tenant offered more than its limit gets exactly its limit
// forwarded and a 400 naming tenant, limit and counts, and the same series
// keep going in on every later request. The gateway's ids are Prometheus'
// label hashes: Tollgate holds labels.Labels.Hash of each accepted series.
func TestSeriesLimit(t *testing.T) {
	// With RefreshInterval, accepted series are not tracked again on every
	// request: the outcome must be the same, with fewer calls.
	for _, refresh := range []time.Duration{0, 30 * time.Second} {
		t.Run(fmt.Sprint("refresh=", refresh), func(t *testing.T) { testSeriesLimit(t, refresh) })
	}
}

// countingTracker counts the series sent to Tollgate.
type countingTracker struct {
	gateway.Tracker
	sent atomic.Int64
}

func (c *countingTracker) TrackSeries(ctx context.Context, tenant string, hs []uint64) ([]uint64, error) {
	c.sent.Add(int64(len(hs)))
	return c.Tracker.TrackSeries(ctx, tenant, hs)
}

func testSeriesLimit(t *testing.T, refresh time.Duration) {
	_, c := startTollgate(t, "tenants:\n  small:\n    max_series: 10\n  big:\n    max_series: 1000\n")
	rcv := newReceiver(t)
	ct := &countingTracker{Tracker: c}
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: ct, Limits: limitsOf(c), RefreshInterval: refresh})

	code, msg, _ := post(t, gw.URL+"/api/v1/push", "big", "", encodeV1(t, seriesV1("up", 0, 50)))
	if code != http.StatusNoContent {
		t.Fatalf("under the limit: %d %s", code, msg)
	}
	got, _ := rcv.snapshot()
	if len(got) != 50 {
		t.Fatalf("under the limit: receiver holds %d series, want 50", len(got))
	}

	code, msg, _ = post(t, gw.URL+"/api/v1/write", "small", "", encodeV1(t, seriesV1("cpu", 0, 15)))
	if code != http.StatusBadRequest {
		t.Fatalf("over the limit: %d %s, want 400", code, msg)
	}
	for _, want := range []string{"user=small", "series limit of 10 exceeded", "5 of 15 series rejected", "10 accepted"} {
		if !strings.Contains(msg, want) {
			t.Errorf("400 message %q lacks %q", msg, want)
		}
	}
	got, _ = rcv.snapshot()
	var first []string
	for _, k := range keys(got) {
		if strings.Contains(k, `"cpu"`) {
			first = append(first, k)
		}
	}
	if len(first) != 10 {
		t.Fatalf("receiver holds %d cpu series, want exactly the limit 10", len(first))
	}
	// The same 15 again, then 15 new ones: the 10 accepted ones receive every
	// sample, nothing else gets in.
	for round, rng := range [][2]int{{0, 15}, {15, 30}, {0, 30}} {
		code, _, _ = post(t, gw.URL+"/api/v1/write", "small", "", encodeV1(t, seriesV1("cpu", rng[0], rng[1])))
		if code != http.StatusBadRequest {
			t.Fatalf("round %d: %d, want 400 (series over the limit)", round, code)
		}
	}
	got, _ = rcv.snapshot()
	var now []string
	for _, k := range keys(got) {
		if strings.Contains(k, `"cpu"`) {
			now = append(now, k)
			if got[k] != 3 { // rounds 0, 2 and the first request
				t.Errorf("accepted series %s received %d samples, want 3", k, got[k])
			}
		}
	}
	if strings.Join(now, ",") != strings.Join(first, ",") {
		t.Fatalf("accepted set changed:\n%v\nthen\n%v", first, now)
	}
	// Sent to Tollgate: 50 + 15 + 15 + 15 + 30 series without remembering;
	// with it the 10 accepted ones are not sent again (15 − 10 in round 0,
	// 30 − 10 in round 2).
	want := int64(50 + 15 + 15 + 15 + 30)
	if refresh > 0 {
		want = 50 + 15 + 5 + 15 + 20
	}
	if got := ct.sent.Load(); got != want {
		t.Errorf("series sent to Tollgate: %d, want %d", got, want)
	}
	// Tollgate holds labels.Labels.Hash of the accepted series: sending
	// them again directly is accepted at the limit, a new one is not.
	var hs []uint64
	for i := range 15 {
		ls := labels.FromStrings("__name__", "cpu", "job", "j", "n", fmt.Sprint(i))
		if slicesContains(first, ls.String()) {
			hs = append(hs, ls.Hash())
		}
	}
	rej, err := c.TrackSeries(context.Background(), "small", hs)
	if err != nil || len(rej) != 0 {
		t.Fatalf("accepted series sent directly by their label hash: rejected %v, err %v", rej, err)
	}
	rej, err = c.TrackSeries(context.Background(), "small", []uint64{labels.FromStrings("__name__", "cpu", "n", "new").Hash()})
	if err != nil || len(rej) != 1 {
		t.Fatalf("a new series at the limit: rejected %v, err %v; want it rejected", rej, err)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestUpstreamFailuresAreRetriable: an upstream 5xx, an unreachable upstream
// and one that does not answer in time are 5xx for the sender; its retry of
// a request at exactly the limit is accepted whole (tracking is
// idempotent: the series were accepted the first time).
func TestUpstreamFailuresAreRetriable(t *testing.T) {
	_, c := startTollgate(t, "tenants:\n  t:\n    max_series: 10\n")
	rcv := newReceiver(t)
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: c})
	body := encodeV1(t, seriesV1("m", 0, 10))

	rcv.status.Store(http.StatusInternalServerError)
	code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", "", body)
	if code != http.StatusInternalServerError || !strings.Contains(msg, "told to fail") {
		t.Fatalf("upstream 500: %d %q", code, msg)
	}
	rcv.status.Store(0)
	if code, msg, _ = post(t, gw.URL+"/api/v1/push", "t", "", body); code != http.StatusNoContent {
		t.Fatalf("retry at the limit: %d %s", code, msg)
	}
	if got, _ := rcv.snapshot(); len(got) != 10 {
		t.Fatalf("receiver holds %d series after the retry, want 10", len(got))
	}

	// Unreachable: a port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String() + "/api/v1/write"
	l.Close()
	_, gw2 := newGateway(t, gateway.Config{Upstream: dead, Tracker: c})
	if code, msg, _ = post(t, gw2.URL+"/api/v1/push", "t", "", body); code != http.StatusBadGateway || !strings.Contains(msg, "unreachable") {
		t.Fatalf("unreachable upstream: %d %q, want 502", code, msg)
	}

	// Too slow: the receiver blocks until released.
	slow := newReceiver(t)
	slow.block = make(chan struct{})
	_, gw3 := newGateway(t, gateway.Config{Upstream: slow.url(), Tracker: c, UpstreamTimeout: 200 * time.Millisecond})
	code, msg, _ = post(t, gw3.URL+"/api/v1/push", "t", "", body)
	close(slow.block)
	if code != http.StatusGatewayTimeout {
		t.Fatalf("slow upstream: %d %q, want 504", code, msg)
	}
}

// TestBadInputRefusedNothingForwarded: every malformed request, remote write
// 1.0 or 2.0, is a 4xx naming its cause; nothing of it is tracked or reaches
// the upstream, and the gateway serves the next good request.
func TestBadInputRefusedNothingForwarded(t *testing.T) {
	_, c := startTollgate(t, "defaults:\n  max_series: 1000\n")
	rcv := newReceiver(t)
	ct := &countingTracker{Tracker: c}
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: ct, MaxRequestBytes: 1 << 20, MaxDecompressedBytes: 4 << 20})
	good := seriesV1("m", 0, 3)
	withLabels := func(ls ...prompb.Label) []byte {
		return encodeV1(t, []prompb.TimeSeries{good[0], {Labels: ls, Samples: good[0].Samples}})
	}
	raw, _ := (&prompb.WriteRequest{Timeseries: good}).Marshal()
	bomb := snappy.Encode(nil, make([]byte, 8<<20)) // 8 MB of zeros: small compressed
	// 2.0: symbols "", __name__, m, job, a, n, 0; series 0 is good.
	syms := []string{"", "__name__", "m", "job", "a", "n", "0"}
	goodRefs := []uint32{1, 2, 3, 4, 5, 6}
	raw2 := rawV2(t, syms, goodRefs, goodRefs)
	const v2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
	cases := []struct {
		name, tenant, ctype string
		body                []byte
		code                int
		want                string
	}{
		{"corrupt snappy", "t", "", []byte("definitely not snappy"), 400, "snappy"},
		{"truncated protobuf", "t", "", snappy.Encode(nil, raw[:len(raw)-3]), 400, "decode protobuf prometheus.WriteRequest"},
		{"unsorted labels", "t", "", withLabels(prompb.Label{Name: "job", Value: "a"}, prompb.Label{Name: "__name__", Value: "x"}), 400, `labels not sorted: "__name__" after "job"`},
		{"duplicate names", "t", "", withLabels(prompb.Label{Name: "a", Value: "1"}, prompb.Label{Name: "a", Value: "2"}), 400, `duplicate label name "a"`},
		{"empty name", "t", "", withLabels(prompb.Label{Name: "", Value: "1"}), 400, "empty name"},
		{"invalid UTF-8 value", "t", "", withLabels(prompb.Label{Name: "a", Value: "\xff\xfe"}), 400, "not valid UTF-8"},
		{"no labels", "t", "", withLabels(), 400, "no labels"},
		{"64 MB body", "t", "", make([]byte, 64<<20), 413, "max_request_bytes"},
		{"decompression bomb", "t", "", bomb, 413, "max_decompressed_bytes"},
		{"no tenant", "", "", encodeV1(t, good), 401, "X-Scope-OrgID"},
		{"bad tenant", "a/../b", "", encodeV1(t, good), 400, "X-Scope-OrgID"},
		{"unknown message", "t", "application/x-protobuf;proto=foo.Bar", encodeV1(t, good), 415, "foo.Bar"},
		{"not protobuf", "t", "application/json", encodeV1(t, good), 415, "application/json"},
		{"2.0 corrupt snappy", "t", v2, []byte("definitely not snappy"), 400, "snappy"},
		{"2.0 truncated protobuf", "t", v2, snappy.Encode(nil, raw2[:len(raw2)-3]), 400, "decode protobuf io.prometheus.write.v2.Request"},
		{"2.0 unsorted labels", "t", v2, snappy.Encode(nil, rawV2(t, syms, goodRefs, []uint32{3, 4, 1, 2})), 400, `series 1: labels not sorted: "__name__" after "job"`},
		{"2.0 duplicate names", "t", v2, snappy.Encode(nil, rawV2(t, syms, goodRefs, []uint32{3, 4, 3, 2})), 400, `series 1: duplicate label name "job"`},
		{"2.0 reference outside the symbols", "t", v2, snappy.Encode(nil, rawV2(t, syms, goodRefs, []uint32{1, 99})), 400, "outside the symbols table of 7 entries"},
		{"2.0 odd labels_refs", "t", v2, snappy.Encode(nil, rawV2(t, syms, goodRefs, []uint32{1, 2, 3})), 400, "not a whole number of name/value pairs"},
		{"2.0 no labels", "t", v2, snappy.Encode(nil, rawV2(t, syms, goodRefs, nil)), 400, "series 1 has no labels"},
		{"2.0 symbols[0] not empty", "t", v2, snappy.Encode(nil, rawV2(t, append([]string{"x"}, syms[1:]...), goodRefs)), 400, "must start with the empty string"},
		{"2.0 invalid UTF-8 symbol", "t", v2, snappy.Encode(nil, rawV2(t, append(syms[:6:6], "\xff"), goodRefs)), 400, "symbols[6] is not valid UTF-8"},
		{"2.0 64 MB body", "t", v2, make([]byte, 64<<20), 413, "max_request_bytes"},
		{"2.0 no tenant", "", v2, snappy.Encode(nil, raw2), 401, "X-Scope-OrgID"},
	}
	for _, tc := range cases {
		code, msg, _ := post(t, gw.URL+"/api/v1/push", tc.tenant, tc.ctype, tc.body)
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %q, want %d naming %q", tc.name, code, strings.TrimSpace(msg), tc.code, tc.want)
		}
	}
	// Another Content-Encoding than snappy.
	code, msg := postRaw(t, gw.URL+"/api/v1/push", http.Header{"X-Scope-Orgid": {"t"}, "Content-Encoding": {"gzip"}}, bytes.NewReader(encodeV1(t, good)))
	if code != http.StatusUnsupportedMediaType || !strings.Contains(msg, `Content-Encoding "gzip"`) {
		t.Errorf("gzip body: %d %q, want 415 naming the encoding", code, strings.TrimSpace(msg))
	}
	// 64 MB without Content-Length (chunked): refused once the bound is read.
	code, msg = postRaw(t, gw.URL+"/api/v1/push", http.Header{"X-Scope-Orgid": {"t"}}, io.MultiReader(bytes.NewReader(make([]byte, 64<<20))))
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "max_request_bytes") {
		t.Errorf("64 MB chunked: %d %q, want 413 naming max_request_bytes", code, strings.TrimSpace(msg))
	}
	if _, n := rcv.snapshot(); n != 0 {
		t.Fatalf("the upstream received %d requests from bad input", n)
	}
	if n := ct.sent.Load(); n != 0 {
		t.Fatalf("%d series of bad requests were tracked", n)
	}
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", "", encodeV1(t, good)); code != http.StatusNoContent {
		t.Fatalf("good request after bad ones: %d %s", code, msg)
	}
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", v2, snappy.Encode(nil, raw2)); code != http.StatusNoContent {
		t.Fatalf("good 2.0 request after bad ones: %d %s", code, msg)
	}
	if got, n := rcv.snapshot(); n != 2 || len(got) != 4 {
		t.Fatalf("after two good requests the upstream got %d requests, %d series; want 2 and 4", n, len(got))
	}
}

// rawV2 marshals a 2.0 request with one sample per series, each series
// given by its labels_refs.
func rawV2(t *testing.T, symbols []string, refs ...[]uint32) []byte {
	t.Helper()
	req := writev2.Request{Symbols: symbols}
	for _, r := range refs {
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{LabelsRefs: r, Samples: []writev2.Sample{{Value: 1, Timestamp: 1000}}})
	}
	raw, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// postRaw posts body with the given headers (and Content-Type
// application/x-protobuf unless set); the body has a Content-Length only
// when it is a *bytes.Reader.
func postRaw(t *testing.T, url string, h http.Header, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	if h.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-protobuf")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}

// TestRemoteWrite2: a 2.0 request is negotiated by Content-Type, forwarded
// as 2.0 with the rejected series removed, and the upstream's written
// counts come back.
func TestRemoteWrite2(t *testing.T) {
	_, c := startTollgate(t, "tenants:\n  t:\n    max_series: 4\n")
	rcv := newReceiver(t)
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: c, Limits: limitsOf(c)})
	req := writev2.Request{Symbols: []string{"", "__name__", "m", "n"}}
	for i := range 6 {
		req.Symbols = append(req.Symbols, fmt.Sprint(i))
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{
			LabelsRefs: []uint32{1, 2, 3, uint32(len(req.Symbols) - 1)},
			Samples:    []writev2.Sample{{Value: 1, Timestamp: 1000}, {Value: 2, Timestamp: 2000}},
		})
	}
	raw, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	code, msg, hdr := post(t, gw.URL+"/api/v1/write", "t", "application/x-protobuf;proto=io.prometheus.write.v2.Request", snappy.Encode(nil, raw))
	if code != http.StatusBadRequest || !strings.Contains(msg, "2 of 6 series rejected") {
		t.Fatalf("2.0 over the limit: %d %q", code, msg)
	}
	if w := hdr.Get("X-Prometheus-Remote-Write-Samples-Written"); w != "8" {
		t.Errorf("samples written header %q, want 8 (4 series × 2)", w)
	}
	got, _ := rcv.snapshot()
	if len(got) != 4 {
		t.Fatalf("receiver holds %v, want 4 series", keys(got))
	}
	rcv.mu.Lock()
	ct := rcv.headers[0].Get("Content-Type")
	rcv.mu.Unlock()
	if !strings.Contains(ct, "io.prometheus.write.v2.Request") {
		t.Errorf("forwarded Content-Type %q, want 2.0's", ct)
	}
	// A bad reference is refused, naming it.
	req.Timeseries[0].LabelsRefs = []uint32{1, 99}
	raw, _ = req.Marshal()
	code, msg, _ = post(t, gw.URL+"/api/v1/write", "t", "application/x-protobuf;proto=io.prometheus.write.v2.Request", snappy.Encode(nil, raw))
	if code != 400 || !strings.Contains(msg, "outside the symbols table") {
		t.Fatalf("bad symbol reference: %d %q", code, msg)
	}
}

// TestFailOpenPerTenant: with Tollgate stopped, a tenant that fails open is
// forwarded and counted, one that fails closed gets 503 and nothing is
// forwarded for it.
func TestFailOpenPerTenant(t *testing.T) {
	cl, c := startTollgate(t, "defaults:\n  max_series: 100\n")
	rcv := newReceiver(t)
	reg := prometheus.NewRegistry()
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: c, TrackTimeout: 500 * time.Millisecond,
		FailOpenTenants: map[string]bool{"open": true}, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Stop(ctx, 0); err != nil {
		t.Fatal(err)
	}
	body := encodeV1(t, seriesV1("m", 0, 5))
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "closed", "", body); code != http.StatusServiceUnavailable || !strings.Contains(msg, "fails closed") {
		t.Fatalf("fail-closed tenant: %d %q, want 503", code, msg)
	}
	if _, n := rcv.snapshot(); n != 0 {
		t.Fatalf("fail-closed tenant: %d requests forwarded", n)
	}
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "open", "", body); code != http.StatusNoContent {
		t.Fatalf("fail-open tenant: %d %q, want 204", code, msg)
	}
	if got, _ := rcv.snapshot(); len(got) != 5 {
		t.Fatalf("fail-open tenant: receiver holds %d series, want 5", len(got))
	}
	out, err := testutil.GatherAndCount(reg, "tollgate_gateway_fail_open_total")
	if err != nil || out != 2 {
		t.Fatalf("fail_open_total series: %d, %v; want one per tenant", out, err)
	}
}

// TestRateLimit429: a tenant over its ingestion rate gets 429 with
// Retry-After and a message naming the rate; nothing of it is forwarded.
func TestRateLimit429(t *testing.T) {
	_, c := startTollgate(t, "tenants:\n  t:\n    max_series: 1000\n    ingestion_rate: 50\n    ingestion_burst: 50\n")
	rcv := newReceiver(t)
	rl := newRateClient(t, c)
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: c, Rate: rl, Limits: limitsOf(c)})
	body := encodeV1(t, seriesV1("m", 0, 20)) // 20 samples a request
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, before := rcv.snapshot()
		code, msg, hdr := post(t, gw.URL+"/api/v1/push", "t", "", body)
		if code == http.StatusTooManyRequests {
			if hdr.Get("Retry-After") == "" || !strings.Contains(msg, "ingestion rate limit, set to 50 samples/s") || !strings.Contains(msg, "user=t") {
				t.Fatalf("429 without Retry-After or naming: %v %q", hdr, msg)
			}
			if _, after := rcv.snapshot(); after != before {
				t.Fatal("a rate-limited request was forwarded")
			}
			return
		}
		if code != http.StatusNoContent {
			t.Fatalf("%d %s", code, msg)
		}
		if time.Now().After(deadline) {
			t.Fatal("no 429 at 20× the rate for 20 s")
		}
	}
}

// TestInflightBoundAndDrain: past MaxInflight a request gets 503 at once;
// on shutdown /readyz fails and the request in flight completes.
func TestInflightBoundAndDrain(t *testing.T) {
	_, c := startTollgate(t, "defaults:\n  max_series: 100\n")
	rcv := newReceiver(t)
	rcv.block = make(chan struct{})
	g, err := gateway.New(gateway.Config{Upstream: rcv.url(), Tracker: c, MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Handler()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	base := "http://" + l.Addr().String()
	body := encodeV1(t, seriesV1("m", 0, 3))
	first := make(chan int, 1)
	go func() {
		code, _, _ := post(t, base+"/api/v1/push", "t", "", body)
		first <- code
	}()
	// The first request holds the only slot while the receiver blocks.
	for !strings.Contains(scrape(t, base), "tollgate_gateway_inflight_requests 1") {
		time.Sleep(5 * time.Millisecond)
	}
	code, msg, hdr := post(t, base+"/api/v1/push", "t", "", body)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(msg, "max_inflight") {
		t.Fatalf("over the in-flight bound: %d %q", code, msg)
	}
	g.BeginShutdown()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(context.Background()) }()
	if err := g.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("Ready during shutdown: %v", err)
	}
	close(rcv.block)
	if code := <-first; code != http.StatusNoContent {
		t.Fatalf("request in flight at shutdown: %d, want 204", code)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func scrape(t *testing.T, base string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestMetricsAndHeaders: counts by tenant, decision and reason; the tenant
// and configured headers reach the upstream; a metadata-only request is
// forwarded.
func TestMetricsAndHeaders(t *testing.T) {
	_, c := startTollgate(t, "tenants:\n  t:\n    max_series: 3\n")
	rcv := newReceiver(t)
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: c, DefaultTenant: "t",
		UpstreamHeaders: map[string]string{"Authorization": "Bearer backend"}, PassHeaders: []string{"X-Trace"}})
	code, _, _ := post(t, gw.URL+"/api/v1/push", "", "", encodeV1(t, seriesV1("m", 0, 5)))
	if code != http.StatusBadRequest {
		t.Fatalf("default tenant over its limit: %d", code)
	}
	raw, _ := (&prompb.WriteRequest{Metadata: []prompb.MetricMetadata{{MetricFamilyName: "m", Help: "h"}}}).Marshal()
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", "", snappy.Encode(nil, raw)); code != http.StatusNoContent {
		t.Fatalf("metadata only: %d %s", code, msg)
	}
	rcv.mu.Lock()
	h := rcv.headers[0]
	n := len(rcv.headers)
	rcv.mu.Unlock()
	if n != 2 || h.Get("X-Scope-OrgID") != "t" || h.Get("Authorization") != "Bearer backend" || h.Get("Content-Encoding") != "snappy" {
		t.Fatalf("forwarded %d requests, headers %v", n, h)
	}
	m := scrape(t, gw.URL)
	for _, want := range []string{
		`tollgate_gateway_series_total{decision="accepted",reason="within_limit",tenant="t"} 3`,
		`tollgate_gateway_series_total{decision="rejected",reason="series_limit",tenant="t"} 2`,
		`tollgate_gateway_samples_total{decision="rejected",reason="series_limit",tenant="t"} 2`,
		`tollgate_gateway_requests_total{code="400"} 1`,
		`tollgate_gateway_requests_total{code="204"} 1`,
		`tollgate_gateway_forwarded_samples_total{tenant="t"} 3`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func newRateClient(t *testing.T, c *clientlib.Client) *ratelimit.Client {
	t.Helper()
	rl, err := ratelimit.New(ratelimit.Config{Addrs: c.Leaders()[:1]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	return rl
}

// TestPartitionLimit: with a partitioned upstream, a request that would take
// one ingest partition over max_series_per_partition is refused whole with
// 429 naming the partition, nothing is forwarded and nothing tracked; a
// request within the limits goes through.
func TestPartitionLimit(t *testing.T) {
	_, c := startTollgate(t, "defaults:\n  max_series: 1000\n")
	rcv := newReceiver(t)
	pl, err := partitionlimit.New(partitionlimit.Config{Partitions: 2,
		Limits: partitionlimit.LimitsFunc(func(string) int64 { return 20 })})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	ct := &countingTracker{Tracker: c}
	_, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: ct, PartitionLimit: pl,
		Partition: func(h uint64) int32 { return int32(h % 2) }})
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", "", encodeV1(t, seriesV1("m", 0, 10))); code != http.StatusNoContent {
		t.Fatalf("10 series over 2 partitions of 20: %d %s", code, msg)
	}
	code, msg, hdr := post(t, gw.URL+"/api/v1/push", "t", "", encodeV1(t, seriesV1("m", 10, 110)))
	if code != http.StatusTooManyRequests || !strings.Contains(msg, "max_series_per_partition of 20") || hdr.Get("Retry-After") == "" {
		t.Fatalf("100 more series: %d %q, want 429 naming the partition limit", code, msg)
	}
	if got, _ := rcv.snapshot(); len(got) != 10 {
		t.Fatalf("receiver holds %d series, want the first 10 only", len(got))
	}
	if n := ct.sent.Load(); n != 10 {
		t.Fatalf("%d series tracked, want 10: a refused request is not tracked", n)
	}
}

// gatedTracker holds every TrackSeries call while its gate is shut.
type gatedTracker struct {
	gateway.Tracker
	mu   sync.Mutex
	gate chan struct{} // nil: open
	sent atomic.Int64
}

func (g *gatedTracker) TrackSeries(ctx context.Context, tenant string, hs []uint64) ([]uint64, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	g.sent.Add(int64(len(hs)))
	return g.Tracker.TrackSeries(ctx, tenant, hs)
}

// TestRefreshAheadOffThePath: a series accepted an interval ago is
// refreshed in the background: a request carrying only such series is
// answered while Tollgate's answer is still held back, and the refresh
// reaches Tollgate once it is let through.
func TestRefreshAheadOffThePath(t *testing.T) {
	_, c := startTollgate(t, "tenants:\n  t:\n    max_series: 100\n")
	rcv := newReceiver(t)
	gt := &gatedTracker{Tracker: c}
	g, gw := newGateway(t, gateway.Config{Upstream: rcv.url(), Tracker: gt, Limits: limitsOf(c),
		RefreshInterval: time.Second, TrackTimeout: time.Minute})
	body := encodeV1(t, seriesV1("up", 0, 20))
	if code, msg, _ := post(t, gw.URL+"/api/v1/push", "t", "", body); code != http.StatusNoContent {
		t.Fatalf("first request: %d %s", code, msg)
	}
	if got := gt.sent.Load(); got != 20 {
		t.Fatalf("first request tracked %d series, want 20", got)
	}
	time.Sleep(1100 * time.Millisecond) // one rotation: the series are in the previous generation
	release := make(chan struct{})
	gt.mu.Lock()
	gt.gate = release
	gt.mu.Unlock()
	answered := make(chan int, 1)
	go func() {
		code, _, _ := post(t, gw.URL+"/api/v1/push", "t", "", body)
		answered <- code
	}()
	select {
	case code := <-answered:
		if code != http.StatusNoContent {
			t.Fatalf("second request: %d", code)
		}
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the request waited for the refresh of series that were still fresh")
	}
	close(release)
	g.WaitRefreshes()
	if got := gt.sent.Load(); got != 40 {
		t.Fatalf("after the background refresh Tollgate saw %d series, want 40", got)
	}
	if _, reqs := rcv.snapshot(); reqs != 2 {
		t.Fatalf("receiver got %d requests, want 2", reqs)
	}
}
