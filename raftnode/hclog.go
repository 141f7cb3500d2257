package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// slogLevelTrace is where hclog's Trace lands in slog (below Debug).
const slogLevelTrace = slog.LevelDebug - 4

// hclogAdapter implements hclog.Logger on top of an *slog.Logger, so that
// raft, its transport and its snapshot store log through the application's
// handler. Messages below min are dropped before reaching the handler.
type hclogAdapter struct {
	l       *slog.Logger
	min     slog.Leveler
	name    string
	implied []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHCLogAdapter(l *slog.Logger, min slog.Leveler, name string) *hclogAdapter {
	return &hclogAdapter{l: l, min: min, name: name}
}

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slogLevelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default: // Info, NoLevel
		return slog.LevelInfo
	}
}

func toHCLogLevel(level slog.Level) hclog.Level {
	switch {
	case level <= slogLevelTrace:
		return hclog.Trace
	case level <= slog.LevelDebug:
		return hclog.Debug
	case level <= slog.LevelInfo:
		return hclog.Info
	case level <= slog.LevelWarn:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

// gatedArg reports whether one of args is an error from this node's
// campaign gate.
func gatedArg(args []any) bool {
	for _, v := range args {
		if err, ok := v.(error); ok && errors.Is(err, ErrMayNotLead) {
			return true
		}
	}
	return false
}

func (a *hclogAdapter) enabled(level slog.Level) bool {
	return level >= a.min.Level() && a.l.Enabled(context.Background(), level)
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lvl := toSlogLevel(level)
	if lvl >= slog.LevelWarn && gatedArg(args) {
		// raft logs every vote request the gate refused (gate.go) as an
		// error, per peer per election timeout: the server logs the reason
		// once, so these are detail.
		lvl = slog.LevelDebug
	}
	if !a.enabled(lvl) {
		return
	}
	attrs := make([]any, 0, len(args)+2)
	if a.name != "" {
		attrs = append(attrs, "component", a.name)
	}
	// hclog allows a leading hclog.Format as a printf-style message.
	if len(args) == 1 {
		if f, ok := args[0].(hclog.Format); ok && len(f) > 0 {
			if s, ok := f[0].(string); ok {
				msg = msg + " " + fmt.Sprintf(s, f[1:]...)
				args = nil
			}
		}
	}
	attrs = append(attrs, args...)
	a.l.Log(context.Background(), lvl, msg, attrs...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) IsTrace() bool { return a.enabled(slogLevelTrace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(slog.LevelInfo) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(slog.LevelWarn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(slog.LevelError) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	b := *a
	b.l = a.l.With(args...)
	b.implied = append(append([]any(nil), a.implied...), args...)
	return &b
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	b := *a
	if b.name != "" {
		b.name += "." + name
	} else {
		b.name = name
	}
	return &b
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	b := *a
	b.name = name
	return &b
}

// SetLevel changes the adapter's threshold (raft never calls it).
func (a *hclogAdapter) SetLevel(level hclog.Level) {
	if level == hclog.NoLevel {
		return
	}
	if level == hclog.Off {
		a.min = slog.Level(1 << 20)
		return
	}
	a.min = toSlogLevel(level)
}

func (a *hclogAdapter) GetLevel() hclog.Level { return toHCLogLevel(a.min.Level()) }

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	level := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = opts.ForceLevel
	}
	return &stdWriter{a: a, level: level, infer: opts != nil && opts.InferLevels}
}

// stdWriter turns each written line into one log record.
type stdWriter struct {
	a     *hclogAdapter
	level hclog.Level
	infer bool
}

func (w *stdWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		msg := string(bytes.TrimSpace(line))
		if msg == "" {
			continue
		}
		level := w.level
		if w.infer {
			level, msg = inferLevel(msg, level)
		}
		w.a.Log(level, msg)
	}
	return len(p), nil
}

// inferLevel understands the "[WARN] msg" prefixes of Go's log users.
func inferLevel(msg string, def hclog.Level) (hclog.Level, string) {
	for _, p := range []struct {
		prefix string
		level  hclog.Level
	}{
		{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info},
		{"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error},
	} {
		if rest, ok := strings.CutPrefix(msg, p.prefix); ok {
			return p.level, strings.TrimSpace(rest)
		}
	}
	return def, msg
}
