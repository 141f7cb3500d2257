package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/raftnode"
)

// TestServeRefused: a node whose raft group was refused at start
// (raftnode.ErrSnapshotCorrupt, as server.New returns it) stays up on its
// HTTP address, alive but not ready: /readyz names the group, the file and
// the remedy, /metrics marks the group refused; and it returns the cause
// (a non-zero exit) once stopped. The refused group comes from a real
// raftnode error value; raftnode.TestSnapshotCorruptRefused makes one on disk.
func TestServeRefused(t *testing.T) {
	port, err := ports.Pick()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	corrupt := &raftnode.SnapshotCorruptError{Group: 2, Path: "/data/raft/group-2/snapshots/3-9000-1/state.bin"}
	cause := fmt.Errorf("start raft: %w", errors.Join(errors.New("raftnode: group 1: fine"),
		fmt.Errorf("raftnode: group 2: %s: %w", corrupt.Path, corrupt)))
	if !errors.Is(cause, raftnode.ErrSnapshotCorrupt) {
		t.Fatal("the cause does not match ErrSnapshotCorrupt")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveRefused(ctx, addr, slog.New(slog.NewTextHandler(io.Discard, nil)), cause) }()

	get := func(path string) (int, string) {
		for {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				select {
				case err := <-done:
					t.Fatalf("serveRefused returned before serving: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d %q, want 200", code, body)
	}
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "group 2") || !strings.Contains(body, corrupt.Path) {
		t.Errorf("/readyz %d %q, want 503 naming group 2 and %s", code, body, corrupt.Path)
	}
	code, body = get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, "tollgate_ready 0") ||
		!strings.Contains(body, `tollgate_raft_group_refused{group="2"} 1`) || strings.Contains(body, `group="1"`) {
		t.Errorf("/metrics %d, want tollgate_ready 0 and group 2 (only) refused:\n%s", code, body)
	}
	cancel()
	if err := <-done; !errors.Is(err, raftnode.ErrSnapshotCorrupt) {
		t.Errorf("serveRefused returned %v, want the cause", err)
	}
	if err := serveRefused(context.Background(), "-", slog.New(slog.NewTextHandler(io.Discard, nil)), cause); err != cause {
		t.Errorf("with no HTTP address: %v, want the cause at once", err)
	}
}
