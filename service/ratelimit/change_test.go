package ratelimit

import (
	"testing"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// leaseRig drives one Lease client stream by hand: each step the client
// reports a cumulative count and the owner ticks; the test reads the cap.
type leaseRig struct {
	t   *testing.T
	o   *Owner
	s   *Session
	now time.Time
	cap uint64
}

func newLeaseRig(t *testing.T, rate float64, burst int64) *leaseRig {
	o := mustNew(t, Config{Period: 100 * time.Millisecond}, 64, 4, func(string) (float64, int64) { return rate, burst })
	r := &leaseRig{t: t, o: o, s: o.NewSession(), now: time.Unix(1_800_000_000, 0)}
	if err := r.s.Absorb(&api.RateReport{ClientId: 1, Strategy: api.RateStrategy_RATE_STRATEGY_LEASE, NewIds: []uint32{1},
		NewNames: []string{"t"}, Ids: []uint32{1}, ConsumedTotal: []uint64{0}, OfferedTotal: []uint64{0}}, r.now); err != nil {
		t.Fatal(err)
	}
	r.tick()
	return r
}

func (r *leaseRig) tick() {
	r.o.Tick(r.now, func(int) bool { return true }, func(int) (string, string) { return "", "" })
	u := r.s.Take()
	if u == nil || len(u.Cap) != 1 {
		r.t.Fatalf("no lease in the update: %v", u)
	}
	r.cap = u.Cap[0]
}

// step advances one period with the client reporting consumed (offered 5×
// more, so it wants more than it gets) and returns the new cap.
func (r *leaseRig) step(consumed uint64) uint64 {
	r.now = r.now.Add(100 * time.Millisecond)
	if err := r.s.Absorb(&api.RateReport{Ids: []uint32{1}, ConsumedTotal: []uint64{consumed}, OfferedTotal: []uint64{5 * consumed}}, r.now); err != nil {
		r.t.Fatal(err)
	}
	r.tick()
	return r.cap
}

// TestLeaseDebtRepaid: tokens admitted past the grants (a client that failed
// open, say) are paid back from the following refill, not forgiven: after a
// client admits 3 seconds' worth at once, the next second grants (almost)
// nothing, and the grants come back to the limit after the debt is paid. The
// old rule granted max(0, level) + refill, so the second after the overshoot
// granted the full limit again.
func TestLeaseDebtRepaid(t *testing.T) {
	const rate = 1000.0
	r := newLeaseRig(t, rate, 0)
	consumed := r.cap + 3*uint64(rate) // over its lease: 3 s worth
	capv := r.step(consumed)
	var granted uint64
	for range 10 {
		granted += capv - consumed
		consumed = capv // spends the whole lease
		capv = r.step(consumed)
	}
	if granted > uint64(0.25*rate) {
		t.Errorf("the second after admitting 3 s worth past the lease granted %d tokens, want ≤ %.0f (the debt is paid first)", granted, 0.25*rate)
	}
	for range 20 {
		consumed = capv
		capv = r.step(consumed)
	}
	granted = 0
	for range 10 {
		granted += capv - consumed
		consumed = capv
		capv = r.step(consumed)
	}
	if g := float64(granted) / rate; g < 0.9 || g > 1.1 {
		t.Errorf("once the debt is paid a second grants %d tokens (%.2f× the limit), want 0.9–1.1×", granted, g)
	}
}
