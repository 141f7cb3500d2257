package server

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

func summariesClient(t *testing.T, addr string) api.SummariesClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), testTokenAuth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return api.NewSummariesClient(cc)
}

// TestWatchSummariesSingleNode: a real node streams the full state, then the
// tenant that crosses the near-limit fraction, with a growing applied index;
// a group out of range is InvalidArgument; stopping the node ends the stream
// with Unavailable.
func TestWatchSummariesSingleNode(t *testing.T) {
	s, tc := startServer(t, t.TempDir(), nil) // share 16 per group, near from 14 (0.85)
	defer stop(t, s)
	sc := summariesClient(t, s.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	bad, err := sc.WatchSummaries(ctx, &api.WatchSummariesRequest{Groups: []uint32{4}})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("group 4 of 4: %v, want InvalidArgument", err)
	}

	stream, err := sc.WatchSummaries(ctx, &api.WatchSummariesRequest{Groups: []uint32{0, 2}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.ServedBy != "n1" || len(first.Groups) != 2 || first.Groups[0].Group != 0 || first.Groups[1].Group != 2 {
		t.Fatalf("first update %v: want groups 0 and 2 from n1", first)
	}
	for _, g := range first.Groups {
		if !g.Full || g.Unavailable != "" || len(g.Added) != 0 {
			t.Fatalf("group %d: %v, want an empty full set", g.Group, g)
		}
	}
	start := first.Groups[0].AppliedIndex

	track(t, tc, "hot", 0, hashesIn(1, 0, 13)) // 13 < 14: not near
	track(t, tc, "hot", 1, hashesIn(2, 1, 1))  // 14: near
	for {
		u, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if u.Heartbeat {
			continue
		}
		if len(u.Groups) != 1 || u.Groups[0].Group != 0 {
			t.Fatalf("update %v: only group 0 changed", u)
		}
		g := u.Groups[0]
		if g.Full || !slices.Equal(g.Added, []string{"hot"}) || g.AppliedIndex <= start {
			t.Fatalf("change %v: want hot added at an index above %d", g, start)
		}
		if n := s.FSM(0).AppliedIndex(); g.AppliedIndex > n {
			t.Fatalf("index %d beyond the replica's %d", g.AppliedIndex, n)
		}
		break
	}

	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = s.Stop(sctx)
	}()
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("stream end on stop: %v, want Unavailable", err)
	}
}

// TestWatchSummariesUnavailableWithoutReplica: a node that holds no replica
// of any group (it waits to be added) says so per group instead of sending
// empty sets a client would trust.
func TestWatchSummariesUnavailableWithoutReplica(t *testing.T) {
	s, err := New(Config{
		Node:   NodeConfig{ID: "lonely", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"},
		Raft:   RaftConfig{Addr: "127.0.0.1:0"},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := summariesClient(t, s.GRPCAddr()).WatchSummaries(ctx, &api.WatchSummariesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Groups) != 4 {
		t.Fatalf("update %v: want all 4 groups", u)
	}
	for _, g := range u.Groups {
		if g.Full || !strings.Contains(g.Unavailable, "holds no replica") {
			t.Errorf("group %d: %v, want unavailable (no replica)", g.Group, g)
		}
	}
}
