package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
)

// 0 means "unlimited" in the flag and in the file alike; a key left out inherits.
func TestLimitsZeroMeansUnlimitedInFileAndFlag(t *testing.T) {
	if got := NewLimits(0).For("x").MaxSeries; got != 0 {
		t.Fatalf("flag 0: max_series %d, want 0 (unlimited)", got)
	}
	base := TenantLimits{MaxSeries: 100}
	cases := []struct {
		name, file string
		tenant     string
		want       int64
	}{
		{"no file keys: flag", "", "x", 100},
		{"defaults 0: unlimited like the flag", "defaults:\n  max_series: 0\n", "x", 0},
		{"defaults set", "defaults:\n  max_series: 7\n", "x", 7},
		{"tenant 0: unlimited", "defaults:\n  max_series: 7\ntenants:\n  a:\n    max_series: 0\n", "a", 0},
		{"tenant unlimited: true", "defaults:\n  max_series: 7\ntenants:\n  a:\n    unlimited: true\n", "a", 0},
		{"tenant key left out inherits defaults", "defaults:\n  max_series: 7\ntenants:\n  a:\n    ingestion_rate: 5\n", "a", 7},
		{"tenant key left out inherits flag", "tenants:\n  a:\n    ingestion_burst: 5\n", "a", 100},
		{"other tenant", "tenants:\n  a:\n    max_series: 3\n", "b", 100},
	}
	for _, tc := range cases {
		l, err := ParseLimits([]byte(tc.file), base)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := l.For(tc.tenant).MaxSeries; got != tc.want {
			t.Errorf("%s: max_series %d, want %d", tc.name, got, tc.want)
		}
	}
	for _, bad := range []string{
		"tenants:\n  a:\n    unlimited: true\n    max_series: 5\n",
		"defaults:\n  max_series: -1\n",
		"tenants:\n  a:\n    max_series: 5\n    max_sereis: 6\n",
	} {
		if _, err := ParseLimits([]byte(bad), base); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestLimitsEffective(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	ls, err := newLimitsSource("", 64, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := (&Server{limits: ls}).EffectiveLimits(), (LimitsInfo{DefaultMaxSeries: 64, DefaultFrom: "flag"}); got != want {
		t.Errorf("no file: %+v, want %+v", got, want)
	}
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, "defaults:\n  max_series: 0\ntenants:\n  a:\n    max_series: 5\n  b: {}\n")
	ls, err = newLimitsSource(path, 64, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	// "b: {}" holds no setting, so it is no override (the runtime config has
	// one encoding per meaning).
	if got, want := (&Server{limits: ls}).EffectiveLimits(), (LimitsInfo{DefaultMaxSeries: 0, DefaultFrom: "file", File: path, Overrides: 1}); got != want {
		t.Errorf("file: %+v, want %+v", got, want)
	}
	writeFile(t, path, "tenants:\n  a:\n    max_series: 5\n")
	ls, err = newLimitsSource(path, 64, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := (&Server{limits: ls}).EffectiveLimits(), (LimitsInfo{DefaultMaxSeries: 64, DefaultFrom: "flag", File: path, Overrides: 1}); got != want {
		t.Errorf("file without defaults: %+v, want %+v", got, want)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The watcher polls every few seconds; a broken file must be reported once per
// change, not once per poll. Polls are driven by hand here (reload(false) is one
// poll), and mtimes are set explicitly so the test does not depend on the file
// system's timestamp granularity.
func TestLimitsBrokenFileReportedOncePerChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	mtime := time.Unix(1_750_000_000, 0)
	write := func(data string) {
		t.Helper()
		writeFile(t, path, data)
		mtime = mtime.Add(time.Second)
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	results := map[bool]int{}
	write("defaults:\n  max_series: 10\n")
	ls, err := newLimitsSource(path, 64, slog.New(slog.DiscardHandler), func(ok bool) { mu.Lock(); results[ok]++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	polls := func(n int) (errs int) {
		for range n {
			if _, err := ls.reload(false); err != nil {
				errs++
			}
		}
		return errs
	}
	if n := polls(3); n != 0 {
		t.Fatalf("good file: %d errors", n)
	}
	write("defaults:\n  max_series: [\n")
	if n := polls(5); n != 1 {
		t.Fatalf("broken file over 5 polls: %d errors, want 1", n)
	}
	if got := ls.Get().For("x").MaxSeries; got != 10 {
		t.Fatalf("broken file replaced the limits: %d", got)
	}
	// Touched but unchanged: not reported again.
	mtime = mtime.Add(time.Second)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if n := polls(3); n != 0 {
		t.Fatalf("touched broken file: %d errors, want 0", n)
	}
	// Changed and still broken (same size): reported once more.
	write("defaults:\n  max_series: {\n")
	if n := polls(3); n != 1 {
		t.Fatalf("changed broken file: %d errors, want 1", n)
	}
	// Gone: reported once.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if n := polls(3); n != 1 {
		t.Fatalf("missing file: %d errors, want 1", n)
	}
	// Fixed: applied.
	write("defaults:\n  max_series: 20\n")
	if n := polls(3); n != 0 || ls.Get().For("x").MaxSeries != 20 {
		t.Fatalf("fixed file: %d errors, max_series %d", n, ls.Get().For("x").MaxSeries)
	}
	mu.Lock()
	defer mu.Unlock()
	if results[false] != 3 || results[true] != 2 {
		t.Errorf("reload results %v, want 3 failures and 2 successes", results)
	}
}

func quietConfig(dir string) Config {
	return Config{
		Node:    NodeConfig{ID: "n1", DataDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Cluster: ClusterConfig{Bootstrap: true},
		Raft:    RaftConfig{Addr: "127.0.0.1:0", NoSync: true},
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
}

func TestDataDirFailedStartLeavesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, port := range []string{"grpc", "http", "raft"} {
		t.Run(port, func(t *testing.T) {
			root := t.TempDir()
			newDir := filepath.Join(root, "new")
			emptyDir := filepath.Join(root, "empty")
			if err := os.Mkdir(emptyDir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, dir := range []string{newDir, emptyDir} {
				cfg := quietConfig(dir)
				switch port {
				case "grpc":
					cfg.Node.GRPCAddr = busy.Addr().String()
				case "http":
					cfg.Node.HTTPAddr = busy.Addr().String()
				case "raft":
					cfg.Raft.Addr = busy.Addr().String()
				}
				s, err := New(cfg)
				if err == nil {
					s.Stop(context.Background())
					t.Fatalf("%s: started with the %s port busy", dir, port)
				}
				if !strings.Contains(err.Error(), busy.Addr().String()) {
					t.Errorf("error does not name the busy address: %v", err)
				}
				entries, rerr := os.ReadDir(dir)
				switch {
				case dir == newDir && !errors.Is(rerr, os.ErrNotExist):
					t.Errorf("data dir created by the failed start is still there (%v, %d entries)", rerr, len(entries))
				case dir == emptyDir && (rerr != nil || len(entries) != 0):
					t.Errorf("empty data dir holds %d entries after the failed start (%v)", len(entries), rerr)
				}
			}
		})
	}
}

// A failed start on a data dir that already holds a node's state must not
// touch it.
func TestDataDirFailedStartKeepsExistingState(t *testing.T) {
	dir := t.TempDir()
	s, c := startServer(t, dir, nil)
	track(t, c, "t1", 0, hashesIn(1, 0, 3))
	stop(t, s)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := quietConfig(dir)
	cfg.Node.GRPCAddr = busy.Addr().String()
	if s, err := New(cfg); err == nil {
		s.Stop(context.Background())
		t.Fatal("started with the gRPC port busy")
	}
	s, _ = startServer(t, dir, nil)
	defer stop(t, s)
	if got := s.FSM(0).TenantActive("t1"); got != 3 {
		t.Fatalf("after a failed start the node holds %d series of t1, want 3", got)
	}
}

func TestDataDirSecondServerRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := startServer(t, dir, nil)
	_, err := New(quietConfig(dir))
	if err == nil {
		t.Fatal("a second server started on the same data dir")
	}
	for _, want := range []string{dir, "in use", fmt.Sprintf("pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "cluster.json")); err != nil {
		t.Errorf("the refused start touched the first server's data: %v", err)
	}
	stop(t, s)
	// Stopping releases the lock.
	s, _ = startServer(t, dir, nil)
	stop(t, s)
}

// rawCodec lets a test client put arbitrary bytes on the wire.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMsg))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
func (rawCodec) Name() string { return "proto" }

// trackRequestBytes encodes a TrackSeriesRequest by hand, so the tenant can be
// bytes that proto.Marshal would refuse.
func trackRequestBytes(tenant []byte, partition uint32, hashes []uint64) *rawMsg {
	fields := (&api.TrackSeriesRequest{}).ProtoReflect().Descriptor().Fields()
	var b []byte
	b = protowire.AppendTag(b, fields.ByName("tenant").Number(), protowire.BytesType)
	b = protowire.AppendBytes(b, tenant)
	b = protowire.AppendTag(b, fields.ByName("partition").Number(), protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(partition))
	var packed []byte
	for _, h := range hashes {
		packed = protowire.AppendFixed64(packed, h)
	}
	b = protowire.AppendTag(b, fields.ByName("hashes").Number(), protowire.BytesType)
	b = protowire.AppendBytes(b, packed)
	m := rawMsg(b)
	return &m
}

func TestCodecInvalidUTF8TenantIsInvalidArgument(t *testing.T) {
	s, c := startServer(t, t.TempDir(), nil)
	defer stop(t, s)
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth,
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	const method = "/tollgate.v1.Tracker/TrackSeries"
	hs := hashesIn(1, 0, 2)

	// The hand encoding is right: a valid tenant is accepted.
	var resp api.TrackSeriesResponse
	if err := cc.Invoke(ctx, method, trackRequestBytes([]byte("ok"), 0, hs), &resp); err != nil || len(resp.RejectedHashes) != 0 {
		t.Fatalf("valid hand-encoded request: %v %v", err, resp.RejectedHashes)
	}
	if got := s.FSM(0).TenantActive("ok"); got != 2 {
		t.Fatalf("hand-encoded request recorded %d series, want 2", got)
	}
	for _, tenant := range [][]byte{{0xff, 0xfe}, []byte("team-\xc3"), []byte("a\xed\xa0\x80b")} {
		err := cc.Invoke(ctx, method, trackRequestBytes(tenant, 0, hs), &resp)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), `"tenant"`) {
			t.Errorf("tenant %q: %v, want InvalidArgument naming the tenant field", tenant, err)
		}
	}
	// Bytes that are not a TrackSeriesRequest at all are bad input too:
	// InvalidArgument saying so, not grpc-go's Internal.
	bad := rawMsg{0x0a, 0xff}
	if err := cc.Invoke(ctx, method, &bad, &resp); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "not a valid tollgate.v1.TrackSeriesRequest") {
		t.Errorf("truncated message: %v, want InvalidArgument naming the message type", err)
	}
	// The server still serves ordinary clients afterwards.
	if rej := track(t, c, "ok", 0, hashesIn(2, 0, 1)); len(rej) != 0 {
		t.Fatalf("rejected %d", len(rej))
	}
}
