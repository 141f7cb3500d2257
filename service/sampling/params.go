package sampling

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tollgate-io/tollgate/sampleconf"
)

// Params are the backlog_controller block of the runtime config:
//
//	backlog_controller:
//	  kind: locate        # the kind whose global sample rate is controlled
//	  target: 5000        # backlog to hold
//	  period: 10s
//	  kp: 4               # proportional gain (percentage points per 1% of target, ×100)
//	  ki: 1               # integral gain per period; 0 = proportional only
//	  min_percent: 5      # never sample less (0..100, default 0)
//	  max_percent: 100    # never sample more (default 100)
//	  stale_after: 30s    # ignore reports older than this (default 3 periods)
//
// yaml.v3 decodes period and stale_after from strings such as "10s".
type Params struct {
	Kind       string        `yaml:"kind" json:"kind"`
	Target     float64       `yaml:"target" json:"target"`
	Period     time.Duration `yaml:"period" json:"period"`
	Kp         float64       `yaml:"kp" json:"kp"`
	Ki         float64       `yaml:"ki" json:"ki"`
	MinPercent float64       `yaml:"min_percent" json:"min_percent"`
	// MaxPercent 0 (left out) means 100: a ceiling of 0 would switch the kind
	// off, which a global rate of 0 says more plainly.
	MaxPercent float64       `yaml:"max_percent" json:"max_percent"`
	StaleAfter time.Duration `yaml:"stale_after" json:"stale_after"`
	// MaxSources bounds the distinct reporting sources held (default 1024).
	MaxSources int `yaml:"max_sources" json:"max_sources"`
}

// Defaults for fields left at 0.
const (
	DefaultMaxSources   = 1024
	defaultStalePeriods = 3
)

// withDefaults fills the fields whose zero value means "default".
func (p Params) withDefaults() Params {
	if p.MaxPercent == 0 {
		p.MaxPercent = 100
	}
	if p.StaleAfter == 0 {
		p.StaleAfter = defaultStalePeriods * p.Period
	}
	if p.MaxSources == 0 {
		p.MaxSources = DefaultMaxSources
	}
	return p
}

// Validate names the first invalid parameter; an invalid set disables the
// controller (New and SetParams keep the error as Status().Reason).
func (p Params) Validate() error {
	p = p.withDefaults()
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case sampleconf.ValidateKind(p.Kind) != nil:
		return fmt.Errorf("backlog_controller.kind: %w", sampleconf.ValidateKind(p.Kind))
	case !finite(p.Target) || p.Target <= 0:
		return fmt.Errorf("backlog_controller.target = %v: must be a finite number > 0", p.Target)
	case p.Period <= 0:
		return fmt.Errorf("backlog_controller.period = %v: must be > 0", p.Period)
	case !finite(p.Kp) || p.Kp < 0:
		return fmt.Errorf("backlog_controller.kp = %v: must be a finite number ≥ 0", p.Kp)
	case !finite(p.Ki) || p.Ki < 0:
		return fmt.Errorf("backlog_controller.ki = %v: must be a finite number ≥ 0", p.Ki)
	case p.Kp == 0 && p.Ki == 0:
		return errors.New("backlog_controller: kp and ki are both 0, so the output could never move; set kp > 0")
	case sampleconf.ValidatePercent(p.MinPercent) != nil:
		return fmt.Errorf("backlog_controller.min_percent = %w", sampleconf.ValidatePercent(p.MinPercent))
	case sampleconf.ValidatePercent(p.MaxPercent) != nil:
		return fmt.Errorf("backlog_controller.max_percent = %w", sampleconf.ValidatePercent(p.MaxPercent))
	case p.MinPercent > p.MaxPercent:
		return fmt.Errorf("backlog_controller: min_percent %v > max_percent %v", p.MinPercent, p.MaxPercent)
	case p.StaleAfter < 0:
		return fmt.Errorf("backlog_controller.stale_after = %v: must be ≥ 0", p.StaleAfter)
	case p.MaxSources < 0:
		return fmt.Errorf("backlog_controller.max_sources = %d: must be ≥ 0", p.MaxSources)
	}
	return nil
}
