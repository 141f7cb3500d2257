package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

const sketchLimits = "defaults:\n  max_series_per_partition: 0\ntenants:\n  t1:\n    max_series_per_partition: 1000000\n  conv:\n    max_series_per_partition: 1000000\n"

func writeSketchLimits(tb testing.TB) string {
	p := filepath.Join(tb.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(sketchLimits), 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestSketchesService: a real node refuses each kind of bad push with
// InvalidArgument and changes nothing, merges good pushes, streams them
// (everything first, then only what changed), and reports them in
// /api/v1/sketches and /metrics.
func TestSketchesService(t *testing.T) {
	limits := writeSketchLimits(t)
	tc := startCluster(t, 1, func(_ int, c *Config) { c.Node.HTTPAddr = "127.0.0.1:0"; c.Limits.File = limits })
	s := tc.nodes[0]
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := api.NewSketchesClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().Unix() / 60
	sp := func(tenant string, part uint32, minute int64, idx uint32, v uint8) *api.Sketch {
		return &api.Sketch{Tenant: tenant, Partition: part, Minute: minute, Sparse: []uint32{api.HLLSparseEntry(idx, v)}}
	}
	// The watch stream opens before any push: its first batch is empty and full.
	ws, err := cl.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: 11})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := ws.Recv(); err != nil || !b.Full || len(b.Sketches) != 0 || b.ServedBy != "n1" {
		t.Fatalf("first batch %+v, %v", b, err)
	}
	bad := map[string]*api.PushSketchesRequest{
		"wrong precision": {Precision: 12, Sketches: []*api.Sketch{sp("t1", 1, now, 1, 3)}},
		"truncated":       {Precision: 11, Sketches: []*api.Sketch{{Tenant: "t1", Partition: 1, Minute: now, Dense: make([]byte, 2047)}}},
		"old minute":      {Precision: 11, Sketches: []*api.Sketch{sp("t1", 1, now-30, 1, 3)}},
		"unknown tenant":  {Precision: 11, Sketches: []*api.Sketch{sp("t2", 1, now, 1, 3)}},
		"partition":       {Precision: 11, Sketches: []*api.Sketch{sp("t1", 5000, now, 1, 3)}},
		"one bad of two":  {Precision: 11, Sketches: []*api.Sketch{sp("t1", 1, now, 1, 3), sp("t1", 2, now, 2048, 3)}},
	}
	for name, req := range bad {
		if _, err := cl.PushSketches(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if n := s.Sketches().Stats().Sketches; n != 0 {
		t.Fatalf("refused pushes left %d sketches", n)
	}
	// A server stream's error arrives with its first Recv.
	if st, err := cl.WatchSketches(ctx, &api.WatchSketchesRequest{Precision: 5}); err == nil {
		if _, err = st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("watch with precision 5: %v, want InvalidArgument", err)
		}
	} else if status.Code(err) != codes.InvalidArgument {
		t.Errorf("watch with precision 5: %v, want InvalidArgument", err)
	}
	resp, err := cl.PushSketches(ctx, &api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{sp("t1", 1, now, 1, 3), sp("t1", 2, now, 9, 4)}})
	if err != nil || resp.Changed != 2 || resp.NodeMinute < now || resp.Incarnation == "" {
		t.Fatalf("push: %+v, %v", resp, err)
	}
	got := map[uint32]bool{}
	for len(got) < 2 {
		b, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, sk := range b.Sketches {
			got[sk.Partition] = true
		}
	}
	// A delta carries only the sketch that changed.
	if _, err := cl.PushSketches(ctx, &api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{sp("t1", 2, now, 10, 4)}}); err != nil {
		t.Fatal(err)
	}
	b, err := ws.Recv()
	if err != nil || b.Full || len(b.Sketches) != 1 || b.Sketches[0].Partition != 2 || len(b.Sketches[0].Sparse) != 2 {
		t.Fatalf("delta batch %+v, %v", b, err)
	}

	var st SketchStatus
	getJSON(t, "http://"+s.HTTPAddr()+"/api/v1/sketches?top=1", &st)
	if st.Stats.Sketches != 2 || len(st.Top) != 1 || st.Top[0].Tenant != "t1" || st.Top[0].Estimate <= 0 {
		t.Fatalf("/api/v1/sketches: %+v", st)
	}
	var ns NodeStatus // the same top-N, bounded, inside /api/v1/status
	getJSON(t, "http://"+s.HTTPAddr()+"/api/v1/status", &ns)
	if ns.Sketches == nil || ns.Sketches.Stats.Sketches != 2 || len(ns.Sketches.Top) != 2 || ns.Sketches.Top[0].Estimate < ns.Sketches.Top[1].Estimate {
		t.Fatalf("/api/v1/status sketches: %+v", ns.Sketches)
	}
	if r, err := testHTTP.Get("http://" + s.HTTPAddr() + "/api/v1/sketches?top=x"); err != nil || r.StatusCode != http.StatusBadRequest {
		t.Fatalf("top=x: %v %v", r.Status, err)
	}
	r, err := testHTTP.Get("http://" + s.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{`tollgate_sketches_held{encoding="sparse"} 2`, `tollgate_sketch_pushes_rejected_total{reason="invalid"} 6`, `tollgate_sketch_subscribers 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func getJSON(tb testing.TB, url string, v any) {
	tb.Helper()
	r, err := testHTTP.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(r.Body)
		tb.Fatalf("GET %s: %s %s", url, r.Status, b)
	}
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		tb.Fatal(err)
	}
}

// TestSketchWindowOnSkewedNode: a node whose wall clock is 30 min slow (far
// beyond the bound, and beyond the 20-minute sketch window) keeps the
// cluster's sketch window: once it has measured its offset to its peers, it
// merges a correct client's current minute and answers with the cluster's
// minute, as a node within the bound (+450 ms) does. Its raw clock would put
// that minute 30 min in the future and refuse the push (InvalidArgument).
func TestSketchWindowOnSkewedNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	limits := writeSketchLimits(t)
	skew := []time.Duration{0, 450 * time.Millisecond, -30 * time.Minute}
	tc := startCluster(t, 3, func(i int, c *Config) { c.Limits.File = limits; c.Clock.TestOffset = skew[i] })
	slow := tc.nodes[2]
	waitFor(t, "n3 measured out of bound", func() bool {
		st := slow.clock.Status()
		return st != nil && !st.InBound
	})
	for i, s := range tc.nodes[1:] {
		cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		now := time.Now().Unix() / 60
		resp, err := api.NewSketchesClient(cc).PushSketches(ctx, &api.PushSketchesRequest{Precision: 11, Sketches: []*api.Sketch{
			{Tenant: "t1", Partition: uint32(i + 1), Minute: now, Sparse: []uint32{api.HLLSparseEntry(5, 3)}}}})
		if err != nil {
			t.Fatalf("node %s (clock %v off): current minute refused: %v", s.cfg.Node.ID, skew[i+1], err)
		}
		if resp.Changed != 1 || resp.NodeMinute < now || resp.NodeMinute > now+1 {
			t.Fatalf("node %s (clock %v off): %+v, want 1 changed and node minute %d (or the next)", s.cfg.Node.ID, skew[i+1], resp, now)
		}
	}
}
