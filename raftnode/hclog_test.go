package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestHCLogAdapter(t *testing.T) {
	var buf syncBuf
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var l hclog.Logger = newHCLogAdapter(base, slog.LevelWarn, "raft")

	l.Info("quiet info")
	l.Debug("quiet debug")
	l.Warn("loud warn", "k", 1)
	l.Named("transport").With("peer", "x").Error("loud error")
	l.Log(hclog.Off, "never")
	out := buf.String()
	if strings.Contains(out, "quiet") || strings.Contains(out, "never") {
		t.Fatalf("below-threshold messages logged:\n%s", out)
	}
	for _, want := range []string{
		`level=WARN msg="loud warn" component=raft k=1`,
		`level=ERROR msg="loud error" peer=x component=raft.transport`,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
	if l.IsInfo() || !l.IsWarn() || l.GetLevel() != hclog.Warn {
		t.Fatalf("levels: info %v warn %v get %v", l.IsInfo(), l.IsWarn(), l.GetLevel())
	}
	if got := l.With("a", 1).ImpliedArgs(); len(got) != 2 {
		t.Fatalf("implied args %v", got)
	}
	if l.ResetNamed("x").Name() != "x" {
		t.Fatal("ResetNamed")
	}

	// Info threshold + standard logger with inferred levels.
	buf.mu.Lock()
	buf.b.Reset()
	buf.mu.Unlock()
	info := newHCLogAdapter(base, slog.LevelInfo, "")
	info.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}).Print("[WARN] from std")
	info.Info("fmt", hclog.Fmt("%d-%s", 7, "x"))
	out = buf.String()
	if !strings.Contains(out, `level=WARN msg="from std"`) || !strings.Contains(out, `msg="fmt 7-x"`) {
		t.Fatalf("unexpected output:\n%s", out)
	}
}
