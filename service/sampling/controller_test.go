package sampling

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func TestInvalidParamsDisable(t *testing.T) {
	for _, c := range []struct {
		name   string
		edit   func(*Params)
		reason string
	}{
		{"NaN kp", func(p *Params) { p.Kp = math.NaN() }, "kp = NaN"},
		{"negative kp", func(p *Params) { p.Kp = -1 }, "kp = -1"},
		{"infinite ki", func(p *Params) { p.Ki = math.Inf(1) }, "ki = +Inf"},
		{"negative ki", func(p *Params) { p.Ki = -0.5 }, "ki = -0.5"},
		{"both gains 0", func(p *Params) { p.Kp, p.Ki = 0, 0 }, "both 0"},
		{"zero period", func(p *Params) { p.Period = 0 }, "period = 0s"},
		{"negative period", func(p *Params) { p.Period = -time.Second }, "period = -1s"},
		{"zero target", func(p *Params) { p.Target = 0 }, "target = 0"},
		{"negative target", func(p *Params) { p.Target = -5 }, "target = -5"},
		{"NaN target", func(p *Params) { p.Target = math.NaN() }, "target = NaN"},
		{"min > max", func(p *Params) { p.MinPercent, p.MaxPercent = 50, 40 }, "min_percent 50 > max_percent 40"},
		{"min > 100", func(p *Params) { p.MinPercent = 101 }, "min_percent = 101"},
		{"max NaN", func(p *Params) { p.MaxPercent = math.NaN() }, "max_percent = NaN"},
		{"empty kind", func(p *Params) { p.Kind = "" }, "kind: kind is empty"},
		{"bad kind", func(p *Params) { p.Kind = "lo cate" }, "backlog_controller.kind"},
		{"negative stale_after", func(p *Params) { p.StaleAfter = -time.Second }, "stale_after"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := tuned()
			c.edit(&p)
			ctl := New(p)
			st := ctl.Status()
			if st.Enabled || !strings.Contains(st.Reason, c.reason) {
				t.Fatalf("status enabled=%v reason %q, want disabled naming %q", st.Enabled, st.Reason, c.reason)
			}
			if err := p.Validate(); err == nil || err.Error() != st.Reason {
				t.Fatalf("Validate() = %v, Status().Reason = %q", err, st.Reason)
			}
			if _, stepped := ctl.Tick(t0); stepped {
				t.Fatal("a disabled controller stepped")
			}
			// A valid SetParams enables it.
			ctl.SetParams(tuned())
			if st := ctl.Status(); !st.Enabled || st.Reason != "" {
				t.Fatalf("after valid SetParams: %+v", st)
			}
		})
	}
	if st := Disabled(nil).Status(); st.Enabled || !strings.Contains(st.Reason, "not configured") {
		t.Fatalf("Disabled(nil): %+v", st)
	}
}

func TestDefaults(t *testing.T) {
	st := New(Params{Kind: "submit", Target: 10, Period: time.Second, Kp: 1}).Status()
	if !st.Enabled || st.Params.MaxPercent != 100 || st.Params.StaleAfter != 3*time.Second ||
		st.Params.MaxSources != DefaultMaxSources || st.OutputPercent != 100 {
		t.Fatalf("defaults not applied: %+v", st)
	}
}

func TestReports(t *testing.T) {
	c := New(tuned())
	for _, bad := range []struct {
		kind, source string
		backlog      float64
		want         error
	}{
		{"submit", "", 5, ErrUnknownKind},
		{"locate", "", -1, ErrInvalidBacklog},
		{"locate", "", math.NaN(), ErrInvalidBacklog},
		{"locate", "", math.Inf(1), ErrInvalidBacklog},
		{"locate", strings.Repeat("s", 129), 5, ErrInvalidSource},
	} {
		if _, err := c.ReportBacklog(bad.kind, bad.source, bad.backlog, t0); !errors.Is(err, bad.want) {
			t.Errorf("ReportBacklog(%q, %.10q, %v) = %v, want %v", bad.kind, bad.source, bad.backlog, err, bad.want)
		}
	}
	// Input is the sum over sources of each one's latest report.
	mustReport(t, c, "a", 1000, t0)
	mustReport(t, c, "a", 3000, t0.Add(time.Second)) // replaces a's 1000
	mustReport(t, c, "b", 4000, t0.Add(2*time.Second))
	res, ok := c.Tick(t0.Add(3 * time.Second))
	if !ok || !res.HasInput || res.Input != 7000 {
		t.Fatalf("tick: %+v stepped=%v, want input 7000", res, ok)
	}
	// e = (5000 − 7000) / 5000 = −0.4: kp term −160, integral −40: clamped to min 5.
	if res.Percent != 5 || !res.Changed {
		t.Fatalf("output %+v, want 5 (changed)", res)
	}
	// Reports go stale after 3 periods (30s): then the output is held, no input.
	res, ok = c.Tick(t0.Add(40 * time.Second))
	if !ok || res.HasInput || res.Percent != 5 || res.Changed {
		t.Fatalf("tick with stale reports: %+v", res)
	}
	st := c.Status()
	if st.Reports != 3 || st.Rejected != 5 || st.Sources != 0 || st.HasInput {
		t.Fatalf("status %+v", st)
	}
}

func TestTooManySources(t *testing.T) {
	p := tuned()
	p.MaxSources = 2
	c := New(p)
	mustReport(t, c, "a", 1, t0)
	mustReport(t, c, "b", 1, t0)
	if _, err := c.ReportBacklog("locate", "c", 1, t0); !errors.Is(err, ErrTooManySources) {
		t.Fatalf("third source: %v, want ErrTooManySources", err)
	}
	mustReport(t, c, "a", 2, t0.Add(time.Second)) // a known source still reports
	// Once b and a are stale, a new source fits.
	mustReport(t, c, "c", 1, t0.Add(time.Minute))
}

func mustReport(t *testing.T, c *Controller, source string, backlog float64, now time.Time) {
	t.Helper()
	if _, err := c.ReportBacklog("locate", source, backlog, now); err != nil {
		t.Fatal(err)
	}
}

// TestTickGrid: steps are a period apart on a fixed grid: a tick before the
// next due time does nothing, a slightly early tick (ticker jitter) steps, and
// after a long pause the grid restarts from now instead of stepping in a burst.
func TestTickGrid(t *testing.T) {
	c := New(tuned()) // period 10s
	mustReport(t, c, "", 5000, t0)
	steps := 0
	for _, d := range []time.Duration{0, 5 * time.Second, 9600 * time.Millisecond, 19 * time.Second, 20 * time.Second, 30 * time.Second, 95 * time.Second, 96 * time.Second, 105 * time.Second} {
		if _, ok := c.Tick(t0.Add(d)); ok {
			steps++
		}
	}
	// 0 ✓, 5s ✗, 9.6s ✓ (within slack of 10s), 19s ✗, 20s ✓, 30s ✓, 95s ✓ (late: rebase to 105s), 96s ✗, 105s ✓.
	if steps != 6 || c.Status().Steps != 6 {
		t.Fatalf("%d steps, want 6", steps)
	}
}

func TestSetParamsKeepsState(t *testing.T) {
	c := New(tuned())
	mustReport(t, c, "", 20000, t0)
	c.Tick(t0)
	mustReport(t, c, "", 5500, t0.Add(10*time.Second))
	c.Tick(t0.Add(10 * time.Second))
	before := c.Status()
	if before.IntegralPercent >= 0 {
		t.Fatalf("integral %v, want < 0 after backlog above target", before.IntegralPercent)
	}
	p := tuned()
	p.Kp = 3
	p.MinPercent = 20
	c.SetParams(p)
	after := c.Status()
	if after.IntegralPercent != math.Max(before.IntegralPercent, -80) || after.OutputPercent < 20 || after.Steps != before.Steps {
		t.Fatalf("retune lost state: before %+v after %+v", before, after)
	}
	p.Kind = "submit"
	c.SetParams(p)
	if st := c.Status(); st.IntegralPercent != 0 || st.OutputPercent != 100 || st.Steps != 0 || st.Sources != 0 {
		t.Fatalf("new kind kept state: %+v", st)
	}
}

// TestRun drives Run with a channel as the clock and checks apply sees each
// changed output once, and a failed apply is retried at the next step.
func TestRun(t *testing.T) {
	c := New(tuned())
	ticks := make(chan time.Time)
	var applied []float64
	fail := true
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(context.Background(), ticks, func(_ context.Context, r Result) error {
			applied = append(applied, r.Percent)
			if fail {
				fail = false
				return errors.New("raft: no leader")
			}
			return nil
		})
	}()
	// tick sends one tick and waits until Run has stepped (Run receives
	// before it steps, so the send alone does not order the next report).
	tick := func(at time.Time, steps uint64) {
		ticks <- at
		for c.Status().Steps < steps {
			runtime.Gosched()
		}
	}
	mustReport(t, c, "", 20000, t0)
	tick(t0, 1) // output 100 → 5: changed, apply fails
	tick(t0.Add(10*time.Second), 2)
	mustReport(t, c, "", 5000, t0.Add(15*time.Second))
	tick(t0.Add(20*time.Second), 3)
	tick(t0.Add(30*time.Second), 4)
	close(ticks)
	<-done
	// Step 1: 5 (apply fails). Step 2: still 5, unchanged but retried. Step 3:
	// backlog at target and no integral (it did not wind up while pinned at
	// min) → 100. Step 4: same input, same output → no apply.
	if len(applied) != 3 || applied[0] != 5 || applied[1] != 5 || applied[2] != 100 {
		t.Fatalf("applied %v", applied)
	}
	if st := c.Status(); st.LastApplyError != "" {
		t.Fatalf("apply error kept after success: %q", st.LastApplyError)
	}
}
