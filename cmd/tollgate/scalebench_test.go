package main

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// TestScaleBenchTinyRun runs every stage of the scale benchmark at tiny sizes
// against real server processes (the binary built from this tree), so the
// scenario keeps working as the server changes: the measurements must be
// there and consistent with what was created, and the series must survive
// the restart. No time is asserted: speed is for BENCHMARKS.md.
func TestScaleBenchTinyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := buildBinary(t)
	var log bytes.Buffer
	o := scaleOpts{bin: bin, dataDir: t.TempDir(), stages: scaleStages, tenants: 60, baseTenants: 10,
		idleWindow: 200 * time.Millisecond, settle: 0, clients: 12, subsPerClient: 3, streamWindow: 2 * time.Second,
		spans: 3000, due: 50, seriesTenants: 3, seriesPerTenant: 5000, concurrency: 4, log: &log}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := runScaleBench(ctx, o)
	if err != nil {
		t.Fatalf("scalebench: %v\nlog:\n%s", err, log.String())
	}
	if res.IdleBase == nil || res.IdleBig == nil || res.IdleLoaded == nil || *res.IdleBase < 0 || *res.IdleBig < 0 {
		t.Errorf("idle CPU not measured: %+v", res)
	}

	a, b := res.StreamsBase, res.StreamsBig
	if a == nil || b == nil {
		t.Fatalf("streams not measured: %+v", res)
	}
	if a.ConfigTenants != 10 || b.ConfigTenants != 60 {
		t.Errorf("first views carry %d and %d tenants, want 10 and 60", a.ConfigTenants, b.ConfigTenants)
	}
	// The first cluster view carries the whole config: more tenants, more bytes.
	if b.ClusterFirstBytes <= a.ClusterFirstBytes {
		t.Errorf("first cluster view %v B at 60 tenants, %v B at 10: it should carry the bigger config", b.ClusterFirstBytes, a.ClusterFirstBytes)
	}
	// A sketch stream follows 3 tenants whatever the node holds: every
	// tenant's sketch was pushed, so a stream that got them all would be
	// about 6 times bigger at 60 tenants.
	if a.SketchFirstBytes <= 0 || math.Abs(b.SketchFirstBytes/a.SketchFirstBytes-1) > 0.2 {
		t.Errorf("first sketch batch %v B at 60 tenants, %v B at 10: want the same size (3 tenants followed)", b.SketchFirstBytes, a.SketchFirstBytes)
	}
	if a.SketchBytesPerMin <= 0 || b.SketchBytesPerMin <= 0 {
		t.Errorf("no sketch changes streamed in the window: %+v / %+v", a, b)
	}
	if a.SketchBytesPerMsg <= 0 || math.Abs(b.SketchBytesPerMsg/a.SketchBytesPerMsg-1) > 0.2 {
		t.Errorf("later sketch batches %v B at 60 tenants, %v B at 10: want the same size", b.SketchBytesPerMsg, a.SketchBytesPerMsg)
	}
	// A limits change travels as a delta (one tenant changed): the same
	// size at 60 tenants as at 10.
	if a.ConfigChangeStreams != 12 || b.ConfigChangeStreams != 12 || a.ConfigChangeBytes <= 0 || math.Abs(b.ConfigChangeBytes/a.ConfigChangeBytes-1) > 0.2 {
		t.Errorf("limits change: %d and %d streams got it, %v B at 10 tenants and %v B at 60: want the same size (a delta)", a.ConfigChangeStreams, b.ConfigChangeStreams, a.ConfigChangeBytes, b.ConfigChangeBytes)
	}

	m := res.Metering
	if m == nil {
		t.Fatal("metering not measured")
	}
	if m.Due != 50 || m.Executed < 50 || m.WorkPasses < 1 || m.ScanPasses < 1 || m.WorkMeanMs <= 0 || m.WorkMaxLeMs <= 0 {
		t.Errorf("sampler passes: %+v", m)
	}
	if m.SpansOpenEnd != 3000-50 {
		t.Errorf("%v spans open after stopping 50 of 3000", m.SpansOpenEnd)
	}

	s := res.Series
	if s == nil {
		t.Fatal("series not measured")
	}
	if s.Series < 15000 || s.After.HeapBytes <= 0 || s.After.RssAnonBytes <= 0 || s.After.VmRSSBytes < s.After.RssAnonBytes {
		t.Errorf("series stage: %+v", s)
	}
	r := res.Restart
	if r == nil || r.ReadySec <= 0 || r.ReadyzSec < r.ReadySec || r.MemoryAfter.RssAnonBytes <= 0 || r.MemoryAfter.HeapBytes <= 0 {
		t.Fatalf("restart: %+v", r)
	}
	if r.SeriesAfter != s.Series {
		t.Errorf("%d series after the restart, %d before", r.SeriesAfter, s.Series)
	}

	// A second run on the same data would start from the first one's spans
	// and series: refused.
	if _, err := runScaleBench(ctx, o); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Errorf("second run on the same --data-dir: %v, want a refusal naming --data-dir", err)
	}

	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"1 idle", "2 streams", "3 metering", "4 series", "5 restart"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table has no %q row:\n%s", want, out.String())
		}
	}
}

// TestScaleBenchHistogramDelta checks how the benchmark reads a histogram
// between two scrapes: count, mean and the bucket every observation fits.
func TestScaleBenchHistogramDelta(t *testing.T) {
	scrape := func(text string) map[string]float64 {
		m, err := parseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	h0 := histOf(scrape(`# HELP x_seconds x
x_seconds_bucket{le="0.001"} 5
x_seconds_bucket{le="0.01"} 7
x_seconds_bucket{le="0.1"} 7
x_seconds_bucket{le="+Inf"} 7
x_seconds_sum 0.02
x_seconds_count 7
`), "x_seconds")
	h1 := histOf(scrape(`x_seconds_bucket{le="0.001"} 6
x_seconds_bucket{le="0.01"} 9
x_seconds_bucket{le="0.1"} 10
x_seconds_bucket{le="+Inf"} 10
x_seconds_sum 0.08
x_seconds_count 10
`), "x_seconds")
	n, mean, le := h1.since(h0)
	if n != 3 || math.Abs(mean-0.02) > 1e-12 || le != 0.1 {
		t.Errorf("since = %v, %v, %v; want 3, 0.02, 0.1", n, mean, le)
	}
	if n, _, _ := h1.since(h1); n != 0 {
		t.Errorf("nothing observed between equal scrapes, got %v", n)
	}
	if _, err := parseMetrics(strings.NewReader("x_total notanumber\n")); err == nil {
		t.Error("a value that is not a number parsed")
	}
}

// TestScaleBenchRefusesBadSizes: bad sizes are refused naming the flag.
func TestScaleBenchRefusesBadSizes(t *testing.T) {
	for _, args := range [][]string{
		{"scalebench", "--tenants", "100001"},
		{"scalebench", "--due", "5", "--spans", "4"},
		{"scalebench", "--stages", "idle,bogus"},
	} {
		cmd := newRootCmd()
		cmd.SetArgs(args)
		cmd.SetOut(new(bytes.Buffer))
		cmd.SetErr(new(bytes.Buffer))
		err := cmd.Execute()
		if err == nil {
			t.Errorf("%v: accepted", args)
			continue
		}
		flag := args[len(args)-2]
		if flag == "--spans" {
			flag = "--due"
		}
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("%v: error %q does not name %s", args, err, flag)
		}
	}
}
