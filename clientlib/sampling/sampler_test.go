package sampling

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// seeded returns a reproducible source for one goroutine.
func seeded(seed uint64) func() uint64 {
	r := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	return r.Uint64
}

// combos are (key %, global %) pairs covering the extremes, the seed's
// 60 × 50 example and rates that are not round in binary.
var combos = []struct{ key, global float64 }{
	{100, 100}, {60, 50}, {30, 100}, {100, 10}, {12.5, 40}, {1, 50},
	{99.9, 99.9}, {33.3, 77.7}, {0, 100}, {100, 0}, {0.5, 100},
}

const decisions = 1_000_000

// testedCombos is every combination, or three under the race detector (the
// plain run checks them all; the race run is for the concurrency tests).
func testedCombos() []struct{ key, global float64 } {
	if raceEnabled {
		return combos[:3]
	}
	return combos
}

func ratesFor(v uint64, key, global float64) Rates {
	return Rates{
		Version: v,
		Global:  map[string]float64{"locate": global},
		Keys:    map[string]map[string]float64{"tenant-a": {"locate": key}},
	}
}

// TestSampledFractionRandom is the bar: over 1e6 decisions the kept
// fraction is within 0.5 percentage points of key% × global%.
func TestSampledFractionRandom(t *testing.T) {
	for i, c := range testedCombos() {
		t.Run(fmt.Sprintf("key%v_global%v", c.key, c.global), func(t *testing.T) {
			s := New(Options{Rand: seeded(uint64(i) + 1)})
			if err := s.Update(ratesFor(1, c.key, c.global)); err != nil {
				t.Fatal(err)
			}
			kept := 0
			for range decisions {
				if s.ShouldSample("tenant-a", "locate") {
					kept++
				}
			}
			checkFraction(t, kept, c.key*c.global/100)
			st := s.Stats().Kinds["locate"]
			if st.Sampled != uint64(kept) || st.Dropped != uint64(decisions-kept) {
				t.Errorf("stats %+v, counted %d kept of %d", st, kept, decisions)
			}
		})
	}
}

// TestSampledFractionItemHash checks the deterministic path on the hardest
// input for a mixer (sequential ids) and on random hashes.
func TestSampledFractionItemHash(t *testing.T) {
	for i, c := range testedCombos() {
		t.Run(fmt.Sprintf("key%v_global%v", c.key, c.global), func(t *testing.T) {
			s := New(Options{})
			if err := s.Update(ratesFor(1, c.key, c.global)); err != nil {
				t.Fatal(err)
			}
			seq, rnd := 0, 0
			next := seeded(uint64(i) + 100)
			for h := range uint64(decisions) {
				if s.ShouldSampleItem("tenant-a", "locate", h) {
					seq++
				}
				if s.ShouldSampleItem("tenant-a", "locate", next()) {
					rnd++
				}
			}
			want := c.key * c.global / 100
			checkFraction(t, seq, want)
			checkFraction(t, rnd, want)
		})
	}
}

func checkFraction(t *testing.T, kept int, wantPercent float64) {
	t.Helper()
	got := 100 * float64(kept) / decisions
	t.Logf("want %.4f%% kept %.4f%% (off by %.4f points)", wantPercent, got, got-wantPercent)
	if math.Abs(got-wantPercent) > 0.5 {
		t.Errorf("kept %.3f%%, want %.3f%% ± 0.5 points", got, wantPercent)
	}
	// The extremes are exact, not approximately right.
	if wantPercent == 0 && kept != 0 || wantPercent == 100 && kept != decisions {
		t.Errorf("rate %v%%: kept %d of %d", wantPercent, kept, decisions)
	}
}

// TestItemHashAgreement: two independent Samplers, given the same rates built
// in a different order, keep and drop exactly the same items.
func TestItemHashAgreement(t *testing.T) {
	a, b := New(Options{}), New(Options{Rand: seeded(9)})
	ra := Rates{Version: 3,
		Global: map[string]float64{"locate": 50, "submit": 80},
		Keys:   map[string]map[string]float64{"k1": {"locate": 60, "submit": 10}, "k2": {"submit": 5}}}
	rb := Rates{Version: 3, Keys: map[string]map[string]float64{}}
	rb.Keys["k2"] = map[string]float64{"submit": 5}
	rb.Keys["k1"] = map[string]float64{"submit": 10, "locate": 60}
	rb.Global = map[string]float64{"submit": 80, "locate": 50}
	if err := a.Update(ra); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(rb); err != nil {
		t.Fatal(err)
	}
	next := seeded(42)
	kept := 0
	for range 200_000 {
		h := next()
		for _, key := range []string{"k1", "k2", "k3"} {
			for _, kind := range []string{"locate", "submit"} {
				x, y := a.ShouldSampleItem(key, kind, h), b.ShouldSampleItem(key, kind, h)
				if x != y {
					t.Fatalf("hash %#x %s/%s: instances disagree (%v vs %v)", h, key, kind, x, y)
				}
				// The documented formula, so other clients can reproduce it.
				if want := Mix(h)>>11 < uint64(a.Rate(key, kind)/100*(1<<53)); x != want {
					t.Fatalf("hash %#x %s/%s: %v, formula says %v", h, key, kind, x, want)
				}
				if x {
					kept++
				}
			}
		}
	}
	if kept == 0 || kept == 200_000*6 {
		t.Fatalf("degenerate: kept %d", kept)
	}
}

// TestItemMonotonic: lowering a rate drops a subset of what was kept.
func TestItemMonotonic(t *testing.T) {
	hi, lo := New(Options{}), New(Options{})
	if err := hi.Update(ratesFor(1, 60, 100)); err != nil {
		t.Fatal(err)
	}
	if err := lo.Update(ratesFor(1, 60, 50)); err != nil {
		t.Fatal(err)
	}
	for h := range uint64(100_000) {
		if lo.ShouldSampleItem("tenant-a", "locate", h) && !hi.ShouldSampleItem("tenant-a", "locate", h) {
			t.Fatalf("item %d kept at 30%% but dropped at 60%%", h)
		}
	}
}

func TestEffectiveRates(t *testing.T) {
	s := New(Options{})
	if got := s.Rate("any", "locate"); got != 100 {
		t.Fatalf("built-in rate %v, want 100", got)
	}
	err := s.Update(Rates{Version: 1,
		Global:  map[string]float64{"locate": 50},
		Default: map[string]float64{"locate": 80, "submit": 20},
		Keys: map[string]map[string]float64{
			"a": {"locate": 60},
			"b": {"submit": 100},
			"z": {"locate": 0},
		}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, kind string
		want      float64
	}{
		{"a", "locate", 30},      // seed example: 60 × 50
		{"a", "submit", 20},      // no own value: default, no global → ×100
		{"b", "locate", 40},      // default 80 × global 50
		{"b", "submit", 100},     // own value
		{"nobody", "locate", 40}, // unknown key: defaults
		{"a", "events", 100},     // unknown kind: 100
		{"z", "locate", 0},
	} {
		if got := s.Rate(c.key, c.kind); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Rate(%s, %s) = %v, want %v", c.key, c.kind, got, c.want)
		}
	}
	for range 1000 {
		if !s.ShouldSample("a", "events") || !s.ShouldSampleItem("a", "events", 7) {
			t.Fatal("unknown kind must always be kept")
		}
		if s.ShouldSample("z", "locate") {
			t.Fatal("0% kept an item")
		}
	}
}

func TestValidation(t *testing.T) {
	s := New(Options{})
	if err := s.Update(ratesFor(5, 60, 50)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		r     Rates
		field string
	}{
		{"NaN global", Rates{Version: 6, Global: map[string]float64{"locate": math.NaN()}}, "global.locate"},
		{"negative", Rates{Version: 6, Default: map[string]float64{"submit": -1}}, "default.submit"},
		{"above 100", Rates{Version: 6, Keys: map[string]map[string]float64{"k": {"locate": 100.0001}}}, `keys["k"].locate`},
		{"infinite", Rates{Version: 6, Global: map[string]float64{"locate": math.Inf(1)}}, "global.locate"},
		{"NaN key", Rates{Version: 6, Keys: map[string]map[string]float64{"k": {"submit": math.NaN()}}}, `keys["k"].submit`},
		{"empty kind", Rates{Version: 6, Global: map[string]float64{"": 5}}, "kind is empty"},
		{"bad kind", Rates{Version: 6, Global: map[string]float64{"lo cate": 5}}, "not allowed"},
		{"kind with a dot", Rates{Version: 6, Global: map[string]float64{"a.x": 5}}, "not allowed"},
		{"long kind", Rates{Version: 6, Global: map[string]float64{"a" + strings.Repeat("b", 64): 5}}, "longer than 64"},
		{"empty key", Rates{Version: 6, Keys: map[string]map[string]float64{"": {"locate": 5}}}, "a key must be"},
		{"version 0", Rates{Global: map[string]float64{"locate": 5}}, "version 0 is reserved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.Update(c.r)
			if err == nil || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("Update: %v, want an error naming %q", err, c.field)
			}
			if s.Version() != 5 || s.Rate("tenant-a", "locate") != 30 {
				t.Fatalf("a refused update changed the rates: version %d, rate %v", s.Version(), s.Rate("tenant-a", "locate"))
			}
		})
	}
	if got := s.Stats().Refused; got != 11 {
		t.Errorf("Refused = %d, want 11", got)
	}
}

func TestVersions(t *testing.T) {
	s := New(Options{})
	r := ratesFor(10, 60, 50)
	if err := s.Update(r); err != nil {
		t.Fatal(err)
	}
	// The caller's maps are copied: mutating them afterwards changes nothing.
	r.Keys["tenant-a"]["locate"] = 1
	if got := s.Rate("tenant-a", "locate"); got != 30 {
		t.Fatalf("rate %v after caller mutated its map, want 30", got)
	}
	if err := s.Update(ratesFor(9, 100, 100)); !errors.Is(err, ErrStaleVersion) {
		t.Fatalf("older version: %v, want ErrStaleVersion", err)
	}
	if err := s.Update(ratesFor(10, 60, 50)); err != nil {
		t.Fatalf("same snapshot again: %v, want a no-op", err)
	}
	if err := s.Update(ratesFor(10, 70, 50)); !errors.Is(err, ErrStaleVersion) {
		t.Fatalf("same version, other rates: %v, want ErrStaleVersion", err)
	}
	if s.Version() != 10 || s.Rate("tenant-a", "locate") != 30 {
		t.Fatalf("version %d rate %v after refusals", s.Version(), s.Rate("tenant-a", "locate"))
	}
	if err := s.Update(ratesFor(11, 100, 20)); err != nil {
		t.Fatal(err)
	}
	if s.Version() != 11 || s.Rate("tenant-a", "locate") != 20 {
		t.Fatalf("version %d rate %v after update to 11", s.Version(), s.Rate("tenant-a", "locate"))
	}
	st := s.Stats()
	if st.Version != 11 || st.Updates != 2 || st.Refused != 2 {
		t.Fatalf("stats %+v, want version 11, 2 updates, 2 refused", st)
	}
	if got := s.Rates(); got.Version != 11 || got.Global["locate"] != 20 {
		t.Fatalf("Rates() = %+v", got)
	}
}

func TestStatsBounds(t *testing.T) {
	s := New(Options{MaxKinds: 2, MaxKeys: 2, Rand: seeded(1)})
	if err := s.Update(ratesFor(1, 50, 100)); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"locate", "a", "b", "c", "d"} {
		for _, key := range []string{"k1", "k2", "k3", "k4"} {
			s.ShouldSample(key, kind)
		}
	}
	st := s.Stats()
	// "locate" is configured and always counted; "a" and "b" fill MaxKinds = 2
	// (locate counts towards it), the rest share OtherKind.
	var total uint64
	for _, c := range st.Kinds {
		total += c.Sampled + c.Dropped
	}
	if total != 20 {
		t.Errorf("kinds count %d decisions, want 20: %+v", total, st.Kinds)
	}
	if _, ok := st.Kinds["locate"]; !ok {
		t.Errorf("configured kind missing: %+v", st.Kinds)
	}
	if c := st.Kinds[OtherKind]; c.Sampled+c.Dropped == 0 || len(st.Kinds) > 3 {
		t.Errorf("kinds beyond the bound not folded into %q: %+v", OtherKind, st.Kinds)
	}
	if len(st.Keys) != 3 || st.Keys["k1"] == nil || st.Keys["k2"] == nil || st.Keys[OtherKey] == nil {
		t.Fatalf("keys: want k1, k2 and %q, got %+v", OtherKey, st.Keys)
	}
	total = 0
	for _, m := range st.Keys {
		for _, c := range m {
			total += c.Sampled + c.Dropped
		}
	}
	if total != 20 {
		t.Errorf("keys count %d decisions, want 20", total)
	}
	if c := st.Keys[OtherKey]["locate"]; c.Sampled+c.Dropped != 2 {
		t.Errorf("k3, k4 locate under %q: %+v", OtherKey, c)
	}
}

// TestConcurrentUpdates runs decisions on several goroutines while versions
// advance (for the race detector) and checks no decision is lost from Stats and
// no goroutine ever sees the version go backwards.
func TestConcurrentUpdates(t *testing.T) {
	s := New(Options{MaxKeys: 8})
	const workers, per = 4, 20_000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for i := range per {
				key := fmt.Sprintf("k%d", i%4)
				if i%2 == 0 {
					s.ShouldSample(key, "locate")
				} else {
					s.ShouldSampleItem(key, "submit", uint64(i*workers+w))
				}
				v := s.Version()
				if v < last {
					t.Errorf("version went back from %d to %d", last, v)
					return
				}
				last = v
			}
		}()
	}
	for v := uint64(1); v <= 200; v++ {
		if err := s.Update(ratesFor(v, float64(v%100), 50)); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
	st := s.Stats()
	var total uint64
	for _, c := range st.Kinds {
		total += c.Sampled + c.Dropped
	}
	if total != workers*per {
		t.Fatalf("counted %d decisions, made %d", total, workers*per)
	}
}

// TestZeroAllocs: the hot path allocates nothing (an allocation count, not a
// timing, so it is a unit test; the speed is in the benchmarks).
func TestZeroAllocs(t *testing.T) {
	s := New(Options{MaxKeys: 16})
	if err := s.Update(ratesFor(1, 60, 50)); err != nil {
		t.Fatal(err)
	}
	s.ShouldSample("tenant-a", "events") // first sight of a kind and key allocates once
	s.ShouldSample("tenant-a", "locate")
	var h uint64
	for name, f := range map[string]func(){
		"ShouldSample":         func() { s.ShouldSample("tenant-a", "locate") },
		"ShouldSampleItem":     func() { h++; s.ShouldSampleItem("tenant-a", "locate", h) },
		"ShouldSample unknown": func() { s.ShouldSample("tenant-a", "events") },
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocs per call, want 0", name, n)
		}
	}
}

// TestManyKinds covers both kind lookups (a scan up to fewKinds, a map above).
func TestManyKinds(t *testing.T) {
	for _, n := range []int{1, fewKinds, fewKinds + 1, 40} {
		s := New(Options{})
		r := Rates{Version: 1, Global: map[string]float64{}}
		for i := range n {
			r.Global[fmt.Sprintf("k%d", i)] = float64(i) / 2
		}
		if err := s.Update(r); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if got := s.Rate("any", fmt.Sprintf("k%d", i)); got != float64(i)/2 {
				t.Fatalf("%d kinds: Rate(k%d) = %v, want %v", n, i, got, float64(i)/2)
			}
		}
		if got := s.Rate("any", "other"); got != 100 {
			t.Fatalf("%d kinds: unknown kind at %v, want 100", n, got)
		}
		if !s.ShouldSample("any", "other") || s.ShouldSample("any", "k0") {
			t.Fatalf("%d kinds: wrong decisions for unknown kind / 0%%", n)
		}
	}
}
