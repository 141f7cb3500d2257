package sampling

import "testing"

// worthWriting: moves under 0.5 points are not worth G raft entries, except
// one that reaches a bound exactly (so the rate can return to 100%).
func TestSamplingWorthWriting(t *testing.T) {
	p := Params{MinPercent: 5, MaxPercent: 100}
	for _, c := range []struct {
		want, cur float64
		write     bool
	}{
		{50, 50, false}, {50.4, 50, false}, {50.5, 50, true}, {49.5, 50, true},
		{100, 99.8, true}, {5, 5.2, true}, {99.9, 100, false}, {5.3, 5, false},
	} {
		if got := worthWriting(c.want, c.cur, p); got != c.write {
			t.Errorf("worthWriting(%v, %v) = %v, want %v", c.want, c.cur, got, c.write)
		}
	}
}
