package server

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
	"github.com/tollgate-io/tollgate/limits"
)

// TenantLimits are one tenant's effective runtime limits (package limits). A
// zero field means "no limit" (MaxSeries = 0: unlimited), as for the
// --default-max-series flag.
type TenantLimits = limits.Effective

// Limits is an immutable, validated set of runtime limits: a runtime
// configuration document (fsm/runtimecfg: the replicated one, or the
// --limits-file parsed into the same form) over the server's base (its
// --default-max-series flag). A tenant's effective limits are the base,
// overlaid by the document's defaults, overlaid by the tenant's own entry; a
// key left out inherits, and 0 means "no limit" exactly as in the flag.
//
// The YAML form (runtimecfg.ParseYAML) is:
//
//	defaults:
//	  max_series: 150000
//	tenants:
//	  tenant-a:
//	    max_series: 1000000
//	  tenant-b:
//	    max_series: 0      # unlimited, same as "unlimited: true"
//	  tenant-c:
//	    ingestion_rate: 10 # max_series left out: inherits 150000
type Limits struct {
	doc  *runtimecfg.Document
	base TenantLimits
	// source says where doc came from: "file" (or flags only) or "runtime config".
	source string
}

// NewLimits returns limits with the given default max_series and no overrides.
func NewLimits(defaultMaxSeries int64) *Limits {
	return &Limits{doc: &runtimecfg.Document{}, base: TenantLimits{MaxSeries: defaultMaxSeries}, source: "file"}
}

// ParseLimits parses and validates a limits file. Unknown keys are errors, so a
// typo does not silently leave a tenant on the default; errors name the field.
func ParseLimits(data []byte, base TenantLimits) (*Limits, error) {
	d, _, err := runtimecfg.ParseYAML(data)
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	d.Version = 0 // a file is not a replicated version
	return &Limits{doc: d, base: base, source: "file"}, nil
}

// For returns a tenant's effective limits.
func (l *Limits) For(tenant string) TenantLimits {
	return l.doc.For(tenant, l.base)
}

// Has reports whether the limits have an entry for the tenant.
func (l *Limits) Has(tenant string) bool {
	_, ok := l.doc.Tenants[tenant]
	return ok
}

// Overridden lists tenants with explicit overrides, sorted.
func (l *Limits) Overridden() []string { return l.doc.TenantNames() }

// Document is the configuration document behind the limits (Version 0 for a
// file or flags).
func (l *Limits) Document() *runtimecfg.Document { return l.doc }

// LimitsInfo describes the limits in force, for the start-up banner and status.
type LimitsInfo struct {
	// DefaultMaxSeries applies to tenants without an entry of their own; 0 = unlimited.
	DefaultMaxSeries int64
	// DefaultFrom says where DefaultMaxSeries comes from: "flag"
	// (--default-max-series), "file" (the file's defaults.max_series) or
	// "runtime config" (the replicated defaults.max_series).
	DefaultFrom string
	File        string // limits file configured; "" when none
	Overrides   int    // tenants with an entry of their own
	// ConfigVersion is the replicated runtime config version in force; 0
	// when none is replicated and the file/flags apply.
	ConfigVersion uint64
}

// EffectiveLimits reports the limits in force now (the replicated runtime
// config once one exists, else the file as last reloaded, else the flags).
func (s *Server) EffectiveLimits() LimitsInfo {
	l := s.limits.Get()
	if s.rcfg != nil {
		l = s.currentLimits()
	}
	info := LimitsInfo{DefaultMaxSeries: l.For("").MaxSeries, DefaultFrom: "flag", File: s.limits.path, Overrides: len(l.doc.Tenants), ConfigVersion: l.doc.Version}
	if l.doc.Defaults.MaxSeries != nil {
		info.DefaultFrom = l.source
	}
	return info
}

// GroupShare is a group's static share of a tenant-wide max_series:
// ceil(maxSeries × partitionsInGroup / P), limits.GroupShare's rule
// (limits.Static). 0 (unlimited) stays 0.
func GroupShare(maxSeries int64, partitionsInGroup, p int) int64 {
	base, _ := limits.GroupShare(maxSeries, 0, partitionsInGroup, p, limits.Static, 0, 0)
	return base
}

// limitsSource holds the current limits and reloads them from a file when it
// changes. Reads are lock-free.
type limitsSource struct {
	cur      atomic.Pointer[Limits]
	path     string
	base     TenantLimits
	log      *slog.Logger
	onReload func(ok bool)

	// What the last attempt saw, good or bad: a file is parsed (and a broken
	// one reported) once per change, not on every poll.
	seenMod  time.Time
	seenSize int64
	seenSum  [sha256.Size]byte
	seenErr  string // last stat/read error, so a missing file is reported once
}

func newLimitsSource(path string, defaultMaxSeries int64, log *slog.Logger, onReload func(bool)) (*limitsSource, error) {
	s := &limitsSource{path: path, log: log, onReload: onReload}
	s.base = TenantLimits{MaxSeries: defaultMaxSeries}
	s.cur.Store(NewLimits(defaultMaxSeries))
	if path == "" {
		return s, nil
	}
	if _, err := s.reload(true); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *limitsSource) Get() *Limits { return s.cur.Load() }

// reload re-reads the file if it changed since the last attempt (modification
// time or size, then content hash, so a touch alone does not reparse). A bad
// file keeps the previous limits in force and is returned as an error once; the
// same bad file is not reported again until it changes.
func (s *limitsSource) reload(force bool) (bool, error) {
	st, err := os.Stat(s.path)
	if err != nil {
		return false, s.readFailed(force, fmt.Errorf("limits file %s: %w", s.path, err))
	}
	if !force && s.seenErr == "" && st.ModTime().Equal(s.seenMod) && st.Size() == s.seenSize {
		return false, nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, s.readFailed(force, fmt.Errorf("limits file %s: %w", s.path, err))
	}
	s.seenErr = ""
	sum := sha256.Sum256(data)
	s.seenMod, s.seenSize = st.ModTime(), st.Size()
	if !force && sum == s.seenSum {
		return false, nil
	}
	s.seenSum = sum
	l, err := ParseLimits(data, s.base)
	if err != nil {
		if s.onReload != nil {
			s.onReload(false)
		}
		return false, fmt.Errorf("limits file %s: %w", s.path, err)
	}
	s.cur.Store(l)
	if s.onReload != nil {
		s.onReload(true)
	}
	return true, nil
}

// readFailed reports a stat/read error unless it is the one already reported.
// The next successful read must parse again, whatever its hash: the content
// last parsed may not be the one in force.
func (s *limitsSource) readFailed(force bool, err error) error {
	s.seenSum = [sha256.Size]byte{}
	if !force && err.Error() == s.seenErr {
		return nil
	}
	s.seenErr = err.Error()
	if s.onReload != nil && !force {
		s.onReload(false)
	}
	return err
}
func (s *limitsSource) watch(stop <-chan struct{}, every time.Duration) {
	if s.path == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			changed, err := s.reload(false)
			if err != nil {
				s.log.Error("limits reload failed; previous limits stay in force", "err", err)
			} else if changed {
				s.log.Info("limits file reloaded", "path", s.path, "overrides", len(s.Get().doc.Tenants))
			}
		}
	}
}
