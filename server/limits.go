package server

import (
	"bytes"
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

// TenantLimits are one tenant's runtime limits. Zero values mean "inherit the
// default" in overrides; in the effective limits MaxSeries = 0 means unlimited.
type TenantLimits struct {
	MaxSeries int64 `yaml:"max_series"`
	// The fields below are read by later subsystems (rate limits, HLL partition
	// limits); they are parsed and validated now so one file serves them all.
	IngestionRate         float64 `yaml:"ingestion_rate"`
	IngestionBurst        int64   `yaml:"ingestion_burst"`
	MaxSeriesPerPartition int64   `yaml:"max_series_per_partition"`
}

// LimitsFile is the YAML runtime-limits file:
//
//	defaults:
//	  max_series: 150000
//	tenants:
//	  tenant-a:
//	    max_series: 1000000
//	  tenant-b:
//	    max_series: 0      # inherits the default (use unlimited: true for no limit)
//	    unlimited: true
type LimitsFile struct {
	Defaults TenantOverride            `yaml:"defaults"`
	Tenants  map[string]TenantOverride `yaml:"tenants"`
}

// TenantOverride is a per-tenant entry; Unlimited lifts max_series entirely.
type TenantOverride struct {
	TenantLimits `yaml:",inline"`
	Unlimited    bool `yaml:"unlimited"`
}

// Limits is an immutable, validated set of runtime limits. A tenant's effective
// limits are the server's base (its --default-max-series flag), overlaid by the
// file's defaults, overlaid by the tenant's own entry; a zero field inherits.
type Limits struct {
	defaults  TenantLimits
	overrides map[string]TenantOverride
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
	if err := validateTenantLimits("defaults", f.Defaults.TenantLimits); err != nil {
		return nil, err
	}
	for name, o := range f.Tenants {
		if err := api.ValidateTenantID(name); err != nil {
			return nil, fmt.Errorf("limits: tenants.%q: %w", name, err)
		}
		if err := validateTenantLimits("tenants."+name, o.TenantLimits); err != nil {
			return nil, err
		}
	}
	return &Limits{defaults: overlay(base, f.Defaults), overrides: f.Tenants}, nil
}

func validateTenantLimits(where string, l TenantLimits) error {
	switch {
	case l.MaxSeries < 0:
		return fmt.Errorf("limits: %s.max_series = %d: must be ≥ 0", where, l.MaxSeries)
	case l.IngestionRate < 0 || math.IsNaN(l.IngestionRate) || math.IsInf(l.IngestionRate, 0):
		return fmt.Errorf("limits: %s.ingestion_rate = %v: must be a finite number ≥ 0", where, l.IngestionRate)
	case l.IngestionBurst < 0:
		return fmt.Errorf("limits: %s.ingestion_burst = %d: must be ≥ 0", where, l.IngestionBurst)
	case l.MaxSeriesPerPartition < 0:
		return fmt.Errorf("limits: %s.max_series_per_partition = %d: must be ≥ 0", where, l.MaxSeriesPerPartition)
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

func overlay(eff TenantLimits, o TenantOverride) TenantLimits {
	if o.MaxSeries != 0 {
		eff.MaxSeries = o.MaxSeries
	}
	if o.Unlimited {
		eff.MaxSeries = 0
	}
	if o.IngestionRate != 0 {
		eff.IngestionRate = o.IngestionRate
	}
	if o.IngestionBurst != 0 {
		eff.IngestionBurst = o.IngestionBurst
	}
	if o.MaxSeriesPerPartition != 0 {
		eff.MaxSeriesPerPartition = o.MaxSeriesPerPartition
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
	lastMod  time.Time
	lastSize int64
	onReload func(ok bool)
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

// reload re-reads the file if its modification time or size changed. A bad file
// keeps the previous limits in force and is reported, never half-applied.
func (s *limitsSource) reload(force bool) (bool, error) {
	st, err := os.Stat(s.path)
	if err != nil {
		return false, fmt.Errorf("limits file %s: %w", s.path, err)
	}
	if !force && st.ModTime().Equal(s.lastMod) && st.Size() == s.lastSize {
		return false, nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, fmt.Errorf("limits file %s: %w", s.path, err)
	}
	l, err := ParseLimits(data, s.base)
	if err != nil {
		if s.onReload != nil {
			s.onReload(false)
		}
		return false, fmt.Errorf("limits file %s: %w", s.path, err)
	}
	s.lastMod, s.lastSize = st.ModTime(), st.Size()
	s.cur.Store(l)
	if s.onReload != nil {
		s.onReload(true)
	}
	return true, nil
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
