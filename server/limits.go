package server

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-io/tollgate/api"
)

// TenantLimits are one tenant's effective runtime limits. A zero field means "no
// limit" (MaxSeries = 0: unlimited), as for the --default-max-series flag.
type TenantLimits struct {
	MaxSeries int64
	// The fields below are read by later subsystems (rate limits, HLL partition
	// limits); they are parsed and validated now so one file serves them all.
	IngestionRate         float64
	IngestionBurst        int64
	MaxSeriesPerPartition int64
}

// LimitsFile is the YAML runtime-limits file. A key that is present sets the
// value, and 0 means "no limit" exactly as in --default-max-series; a key that is
// left out inherits (a tenant from defaults, defaults from the flag):
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
type LimitsFile struct {
	Defaults TenantOverride            `yaml:"defaults"`
	Tenants  map[string]TenantOverride `yaml:"tenants"`
}

// TenantOverride is one section of the file. Pointer fields tell a key left out
// (nil: inherit) from an explicit 0 (no limit). Unlimited is the readable
// spelling of max_series: 0.
type TenantOverride struct {
	MaxSeries             *int64   `yaml:"max_series"`
	IngestionRate         *float64 `yaml:"ingestion_rate"`
	IngestionBurst        *int64   `yaml:"ingestion_burst"`
	MaxSeriesPerPartition *int64   `yaml:"max_series_per_partition"`
	Unlimited             bool     `yaml:"unlimited"`
}

// Limits is an immutable, validated set of runtime limits. A tenant's effective
// limits are the server's base (its --default-max-series flag), overlaid by the
// file's defaults, overlaid by the tenant's own entry; a key left out inherits.
type Limits struct {
	defaults  TenantLimits
	overrides map[string]TenantOverride
	// defaultFromFile: the file's defaults set max_series, so the flag's value is
	// not the one in force (the banner says which applies).
	defaultFromFile bool
}

// NewLimits returns limits with the given default max_series and no overrides.
func NewLimits(defaultMaxSeries int64) *Limits {
	return &Limits{defaults: TenantLimits{MaxSeries: defaultMaxSeries}}
}

// ParseLimits parses and validates a limits file. Unknown keys are errors, so a
// typo does not silently leave a tenant on the default.
func ParseLimits(data []byte, base TenantLimits) (*Limits, error) {
	var f LimitsFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse limits: %w", err)
	}
	if err := validateOverride("defaults", f.Defaults); err != nil {
		return nil, err
	}
	for name, o := range f.Tenants {
		if err := api.ValidateTenantID(name); err != nil {
			return nil, fmt.Errorf("limits: tenants.%q: %w", name, err)
		}
		if err := validateOverride("tenants."+name, o); err != nil {
			return nil, err
		}
	}
	return &Limits{
		defaults:        overlay(base, f.Defaults),
		overrides:       f.Tenants,
		defaultFromFile: f.Defaults.MaxSeries != nil || f.Defaults.Unlimited,
	}, nil
}

func validateOverride(where string, o TenantOverride) error {
	switch {
	case o.MaxSeries != nil && *o.MaxSeries < 0:
		return fmt.Errorf("limits: %s.max_series = %d: must be ≥ 0 (0 = unlimited)", where, *o.MaxSeries)
	case o.Unlimited && o.MaxSeries != nil && *o.MaxSeries != 0:
		return fmt.Errorf("limits: %s: unlimited: true contradicts max_series = %d; keep one", where, *o.MaxSeries)
	case o.IngestionRate != nil && (*o.IngestionRate < 0 || math.IsNaN(*o.IngestionRate) || math.IsInf(*o.IngestionRate, 0)):
		return fmt.Errorf("limits: %s.ingestion_rate = %v: must be a finite number ≥ 0", where, *o.IngestionRate)
	case o.IngestionBurst != nil && *o.IngestionBurst < 0:
		return fmt.Errorf("limits: %s.ingestion_burst = %d: must be ≥ 0", where, *o.IngestionBurst)
	case o.MaxSeriesPerPartition != nil && *o.MaxSeriesPerPartition < 0:
		return fmt.Errorf("limits: %s.max_series_per_partition = %d: must be ≥ 0", where, *o.MaxSeriesPerPartition)
	}
	return nil
}

// For returns a tenant's effective limits.
func (l *Limits) For(tenant string) TenantLimits {
	o, ok := l.overrides[tenant]
	if !ok {
		return l.defaults
	}
	return overlay(l.defaults, o)
}

// Has reports whether the file has an entry for the tenant.
func (l *Limits) Has(tenant string) bool {
	_, ok := l.overrides[tenant]
	return ok
}

func overlay(eff TenantLimits, o TenantOverride) TenantLimits {
	if o.MaxSeries != nil {
		eff.MaxSeries = *o.MaxSeries
	}
	if o.Unlimited {
		eff.MaxSeries = 0
	}
	if o.IngestionRate != nil {
		eff.IngestionRate = *o.IngestionRate
	}
	if o.IngestionBurst != nil {
		eff.IngestionBurst = *o.IngestionBurst
	}
	if o.MaxSeriesPerPartition != nil {
		eff.MaxSeriesPerPartition = *o.MaxSeriesPerPartition
	}
	return eff
}

// Overridden lists tenants with explicit overrides, sorted.
func (l *Limits) Overridden() []string {
	names := make([]string, 0, len(l.overrides))
	for n := range l.overrides {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LimitsInfo describes the limits in force, for the start-up banner and status.
type LimitsInfo struct {
	// DefaultMaxSeries applies to tenants without an entry of their own; 0 = unlimited.
	DefaultMaxSeries int64
	// DefaultFrom says where DefaultMaxSeries comes from: "flag"
	// (--default-max-series) or "file" (the file's defaults.max_series).
	DefaultFrom string
	File        string // limits file in use; "" when none
	Overrides   int    // tenants with an entry in the file
}

// EffectiveLimits reports the limits in force now (the file may have been
// reloaded since start).
func (s *Server) EffectiveLimits() LimitsInfo {
	l := s.limits.Get()
	info := LimitsInfo{DefaultMaxSeries: l.defaults.MaxSeries, DefaultFrom: "flag", File: s.limits.path, Overrides: len(l.overrides)}
	if l.defaultFromFile {
		info.DefaultFrom = "file"
	}
	return info
}

// GroupShare is a group's share of a tenant-wide max_series:
// ceil(maxSeries × partitionsInGroup / P). 0 (unlimited) stays 0.
func GroupShare(maxSeries int64, partitionsInGroup, p int) int64 {
	if maxSeries <= 0 {
		return 0
	}
	num := maxSeries * int64(partitionsInGroup)
	return (num + int64(p) - 1) / int64(p)
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
	s.cur.Store(NewLimits(defaultMaxSeries))
	s.base = TenantLimits{MaxSeries: defaultMaxSeries}
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
				s.log.Info("limits reloaded", "path", s.path, "overrides", len(s.Get().overrides))
			}
		}
	}
}
