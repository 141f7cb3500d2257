package sampling

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Report errors; Handler maps them to HTTP statuses.
var (
	ErrUnknownKind    = errors.New("no backlog controller for this kind")
	ErrInvalidBacklog = errors.New("backlog must be a finite number ≥ 0")
	ErrInvalidSource  = errors.New("source must be at most 128 bytes")
	ErrTooManySources = errors.New("too many backlog sources")
	// ErrUnavailable is for a Reporter that forwards reports (the server, to
	// the config owner) and cannot reach where the controller runs.
	ErrUnavailable = errors.New("backlog controller unreachable")

	errNotConfigured = errors.New("backlog_controller: not configured")
)

const (
	maxSourceLen      = 128
	outputQuantum     = 0.01 // percent; smaller moves are not worth a config write
	tickSlackFraction = 20   // a tick up to period/20 early still steps
)

// Controller is one backlog controller. It is safe for concurrent use:
// reports arrive from HTTP handlers while the owner ticks it.
type Controller struct {
	mu      sync.Mutex
	p       Params // with defaults
	reason  error  // nil: enabled
	sources map[string]sample

	output   float64 // percent, last computed (max_percent before the first step)
	integral float64
	input    float64 // last aggregated backlog
	hasInput bool
	errRatio float64
	nextDue  time.Time
	lastStep time.Time
	steps    uint64
	reports  uint64
	rejected uint64
	applyErr error
}

type sample struct {
	backlog float64
	at      time.Time
}

// New returns a controller for p. Invalid parameters do not fail: the
// controller is disabled and Status().Reason says why.
func New(p Params) *Controller {
	c := &Controller{sources: map[string]sample{}}
	c.SetParams(p)
	return c
}

// SetParams replaces the parameters (a config change). The integral survives
// a change that keeps the kind, clamped into the new output range, so a
// retuned controller continues from where it was; a new kind starts afresh.
func (c *Controller) SetParams(p Params) {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := p.Validate()
	p = p.withDefaults()
	if err == nil && p.Kind == c.p.Kind && c.reason == nil && c.steps > 0 {
		c.integral = clamp(c.integral, p.MinPercent-p.MaxPercent, 0)
		c.output = clamp(c.output, p.MinPercent, p.MaxPercent)
	} else {
		c.integral, c.output, c.steps, c.nextDue = 0, p.MaxPercent, 0, time.Time{}
		clear(c.sources)
		c.hasInput = false
	}
	c.p, c.reason = p, err
}

// Disabled returns a controller that is off for the given reason (for a
// config without a backlog_controller block, pass nil).
func Disabled(reason error) *Controller {
	if reason == nil {
		reason = errNotConfigured
	}
	c := &Controller{sources: map[string]sample{}, reason: reason, output: 100}
	return c
}

// ReportBacklog records source's backlog for kind at now. Each source's latest
// report counts until it is older than stale_after; the controller's input is
// the sum over sources (give each queue its own source name; reporters of one
// shared queue should use one name). source may be "".
func (c *Controller) ReportBacklog(kind, source string, backlog float64, now time.Time) (Status, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	switch {
	case kind != c.p.Kind || c.p.Kind == "":
		err = fmt.Errorf("%w %q (controlled kind: %q)", ErrUnknownKind, kind, c.p.Kind)
	case math.IsNaN(backlog) || math.IsInf(backlog, 0) || backlog < 0:
		err = fmt.Errorf("%w: got %v", ErrInvalidBacklog, backlog)
	case len(source) > maxSourceLen:
		err = fmt.Errorf("%w: got %d bytes", ErrInvalidSource, len(source))
	}
	if err == nil {
		if _, known := c.sources[source]; !known && len(c.sources) >= c.p.MaxSources {
			c.pruneLocked(now)
			if len(c.sources) >= c.p.MaxSources {
				err = fmt.Errorf("%w: %d fresh sources already report (max_sources); reuse source names", ErrTooManySources, len(c.sources))
			}
		}
	}
	if err != nil {
		c.rejected++
		return c.statusLocked(), err
	}
	c.sources[source] = sample{backlog: backlog, at: now}
	c.reports++
	return c.statusLocked(), nil
}

func (c *Controller) pruneLocked(now time.Time) {
	for s, v := range c.sources {
		if now.Sub(v.at) > c.p.StaleAfter {
			delete(c.sources, s)
		}
	}
}

// Result is what one step computed.
type Result struct {
	Kind string
	// Percent is the global sample percentage for Kind.
	Percent float64
	// Changed: Percent differs from the previous step's, so it should be
	// written to the config.
	Changed bool
	// Input is the summed backlog the step used; HasInput false means no
	// fresh report, and the output was held.
	Input    float64
	HasInput bool
}

// Tick runs one control step if one is due at now (steps are period apart on
// a fixed grid, so a ticker's jitter does not stretch the period) and reports
// whether it did. A disabled controller never steps.
func (c *Controller) Tick(now time.Time) (Result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason != nil {
		return Result{}, false
	}
	slack := c.p.Period / tickSlackFraction
	if !c.nextDue.IsZero() && now.Add(slack).Before(c.nextDue) {
		return Result{}, false
	}
	if c.nextDue.IsZero() {
		c.nextDue = now
	}
	c.nextDue = c.nextDue.Add(c.p.Period)
	if !c.nextDue.After(now) { // fell behind by more than a period: rebase
		c.nextDue = now.Add(c.p.Period)
	}
	return c.stepLocked(now), true
}

func (c *Controller) stepLocked(now time.Time) Result {
	c.pruneLocked(now)
	c.steps++
	c.lastStep = now
	prev := c.output
	c.hasInput = len(c.sources) > 0
	if !c.hasInput {
		return Result{Kind: c.p.Kind, Percent: c.output}
	}
	var sum float64
	for _, s := range c.sources {
		sum += s.backlog
	}
	c.input = sum
	p := c.p
	e := (p.Target - sum) / p.Target
	c.errRatio = e
	prop := 100 * p.Kp * e
	integral := clamp(c.integral+100*p.Ki*e, p.MinPercent-p.MaxPercent, 0)
	raw := p.MaxPercent + prop + integral
	// Conditional integration: when the output is pinned at a bound and the
	// error pushes it further, integrating would only store up a delay.
	if !(raw > p.MaxPercent && e > 0) && !(raw < p.MinPercent && e < 0) {
		c.integral = integral
	}
	out := clamp(p.MaxPercent+prop+c.integral, p.MinPercent, p.MaxPercent)
	out = math.Round(out/outputQuantum) * outputQuantum
	c.output = out
	return Result{Kind: p.Kind, Percent: out, Changed: out != prev, Input: sum, HasInput: true}
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

// Run ticks the controller on every value from ticks (a time.Ticker's C, or a
// simulated clock's) until ctx ends or ticks closes, and calls apply with each
// changed output. An apply error is kept for Status and the next step's
// output is applied again even if unchanged, so a failed config write is
// retried.
func (c *Controller) Run(ctx context.Context, ticks <-chan time.Time, apply func(context.Context, Result) error) {
	retry := false
	for {
		select {
		case <-ctx.Done():
			return
		case now, ok := <-ticks:
			if !ok {
				return
			}
			res, stepped := c.Tick(now)
			if !stepped || !(res.Changed || retry) {
				continue
			}
			err := apply(ctx, res)
			retry = err != nil
			c.mu.Lock()
			c.applyErr = err
			c.mu.Unlock()
		}
	}
}

// Status is the controller's state for `tollgate status`, logs and metrics.
type Status struct {
	Kind    string `json:"kind"`
	Enabled bool   `json:"enabled"`
	// Reason is why the controller is disabled ("" when enabled).
	Reason        string  `json:"reason,omitempty"`
	OutputPercent float64 `json:"output_percent"`
	// InputBacklog is the summed backlog of the last step (HasInput false: the
	// last step had no fresh report and held the output).
	InputBacklog float64 `json:"input_backlog"`
	HasInput     bool    `json:"has_input"`
	Target       float64 `json:"target_backlog"`
	// ErrorRatio is (target − input) / target at the last step.
	ErrorRatio      float64   `json:"error_ratio"`
	IntegralPercent float64   `json:"integral_percent"`
	Sources         int       `json:"sources"`
	Steps           uint64    `json:"steps"`
	Reports         uint64    `json:"reports"`
	Rejected        uint64    `json:"rejected_reports"`
	LastStep        time.Time `json:"last_step,omitzero"`
	LastApplyError  string    `json:"last_apply_error,omitempty"`
	Params          Params    `json:"params"`
}

// Status returns the current state.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusLocked()
}

func (c *Controller) statusLocked() Status {
	st := Status{
		Kind: c.p.Kind, Enabled: c.reason == nil, OutputPercent: c.output,
		InputBacklog: c.input, HasInput: c.hasInput, Target: c.p.Target,
		ErrorRatio: c.errRatio, IntegralPercent: c.integral, Sources: len(c.sources),
		Steps: c.steps, Reports: c.reports, Rejected: c.rejected, LastStep: c.lastStep,
		Params: c.p,
	}
	if c.reason != nil {
		st.Reason = c.reason.Error()
	}
	if c.applyErr != nil {
		st.LastApplyError = c.applyErr.Error()
	}
	return st
}
