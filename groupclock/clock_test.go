package groupclock

import (
	"testing"
	"time"
)

// sim is a node's clocks: true time advances both; the wall clock is true
// time plus a skew.
type sim struct {
	mono time.Time
	skew time.Duration
	t0   time.Time
}

func newSim(skew time.Duration) *sim {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	return &sim{mono: time.Unix(0, 0), skew: skew, t0: t0}
}

func (s *sim) advance(d time.Duration) { s.mono = s.mono.Add(d) }
func (s *sim) truth() int64            { return s.t0.Add(s.mono.Sub(time.Unix(0, 0))).UnixMilli() }

func (s *sim) clock(bound time.Duration, trusted bool) *Clock {
	return New(Config{
		Wall:    func() time.Time { return s.t0.Add(s.mono.Sub(time.Unix(0, 0))).Add(s.skew) },
		Mono:    func() time.Time { return s.mono },
		Bound:   bound,
		Trusted: func() bool { return trusted },
	})
}

// A settled follower of a correct group that becomes leader with a clock 5
// minutes fast moves the group's time ahead by at most the bound, and with
// one 5 minutes slow it does not hold the time back.
func TestLeaderSkewIsBounded(t *testing.T) {
	for _, skew := range []time.Duration{5 * time.Minute, -5 * time.Minute, 30 * time.Minute, 400 * time.Millisecond} {
		s := newSim(skew)
		c := s.clock(time.Second, false)
		for range 90 { // watch the group for 90 s: one stamp a second
			c.Observe(s.truth())
			s.advance(time.Second)
		}
		c.SetLeader(true)
		for i := range 300 {
			got := c.Now()
			diff := time.Duration(got-s.truth()) * time.Millisecond
			if diff < -time.Second || diff > time.Second {
				t.Fatalf("skew %v, %d s into leadership: group time %v from true time, want within the 1s bound", skew, i, diff)
			}
			c.Observe(got) // its own entries apply here too
			s.advance(time.Second)
		}
	}
}

// Leadership moving back and forth between a correct node and a fast one
// never lets the group's time run away: each term can add at most the
// bound, and the correct node's terms do not add anything.
func TestAlternatingLeadersDoNotAccumulate(t *testing.T) {
	good, fast := newSim(0), newSim(5*time.Minute)
	cg, cf := good.clock(time.Second, true), fast.clock(time.Second, false)
	step := func(d time.Duration) { good.advance(d); fast.advance(d) }
	for range 90 {
		tt := good.truth()
		cg.Observe(tt)
		cf.Observe(tt)
		step(time.Second)
	}
	for term := range 20 {
		leader, follower := cg, cf
		if term%2 == 1 {
			leader, follower = cf, cg
		}
		leader.SetLeader(true)
		for range 30 {
			v := leader.Now()
			leader.Observe(v)
			follower.Observe(v)
			step(time.Second)
		}
		leader.SetLeader(false)
	}
	ahead := time.Duration(cg.Estimate()-good.truth()) * time.Millisecond
	if ahead > 10*time.Second+time.Second || ahead < -time.Second {
		t.Fatalf("after 20 terms (10 on a +5m node) the group's time is %v from true time; want at most 10 bounds ahead", ahead)
	}
}

// Time never goes backwards, whatever the wall clock does.
func TestNeverBackwards(t *testing.T) {
	s := newSim(0)
	c := s.clock(time.Second, true)
	c.Observe(s.truth() + 20_000) // a fast earlier leader stamped 20 s ahead
	prev := int64(0)
	c.SetLeader(true)
	for range 100 {
		v := c.Now()
		if v < prev {
			t.Fatalf("time went back from %d to %d", prev, v)
		}
		prev = v
		s.advance(100 * time.Millisecond)
	}
	if prev < s.truth()+20_000-1000 {
		t.Fatalf("leader stamped %d, behind the observed time %d", prev, s.truth()+20_000)
	}
}

// A node whose estimate lags (it comes from replayed, old entries) stamps its
// wall clock when trusted, and is held to estimate+bound when not.
func TestTrustedLeaderCatchesUp(t *testing.T) {
	s := newSim(0)
	c := s.clock(time.Second, true)
	c.Observe(s.truth() - 3_600_000) // the log's last entry is an hour old
	c.SetLeader(true)
	if v := c.Now(); v != s.truth() {
		t.Fatalf("trusted leader stamped %d, want its wall clock %d", v, s.truth())
	}
	s2 := newSim(5 * time.Minute)
	c2 := s2.clock(time.Second, false)
	c2.Observe(s2.truth())
	c2.SetLeader(true)
	if v := c2.Now(); v > s2.truth()+1000 {
		t.Fatalf("untrusted leader (+5m) stamped %d ms ahead; want at most the bound", v-s2.truth())
	}
}

// With nothing observed (a new group), the wall clock is used.
func TestNoObservation(t *testing.T) {
	s := newSim(0)
	c := s.clock(time.Second, false)
	if v := c.Now(); v != s.truth() {
		t.Fatalf("got %d, want the wall clock %d", v, s.truth())
	}
	if c.Estimate() != 0 {
		t.Fatal("no observation yet: estimate 0")
	}
}
