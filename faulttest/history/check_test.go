package history

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tr is a track operation by client c over [call, ret].
func tr(c int, call, ret int64, key string, hashes []uint64, outcome Outcome, rejected ...uint64) Op {
	return Op{Client: c, Kind: KindTrack, Key: key, Call: call, Return: ret, Hashes: hashes, Outcome: outcome, Rejected: rejected}
}

func get(c int, call, ret int64, version uint64, value string) Op {
	return Op{Client: c, Kind: KindConfigGet, Key: "doc", Call: call, Return: ret, Outcome: OK, Version: version, Value: value}
}

func cas(c int, call, ret int64, expected uint64, value string, outcome Outcome, version uint64) Op {
	return Op{Client: c, Kind: KindConfigCAS, Key: "doc", Call: call, Return: ret, Expected: expected, Value: value, Outcome: outcome, Version: version}
}

// ev is a metering event (stop when stop) on instance "a" at ts ms.
func ev(c int, call, ret int64, id string, ts int64, stop bool, outcome Outcome) Op {
	return Op{Client: c, Kind: KindMeterEvent, Key: "a", Call: call, Return: ret, ID: id, Time: ts, Stop: stop, Outcome: outcome}
}

// usage is a read of instance "a"'s usage: window start → ms.
func usage(c int, call, ret int64, u map[int64]int64) Op {
	return Op{Client: c, Kind: KindMeterUsage, Key: "a", Call: call, Return: ret, Outcome: OK, Usage: u}
}

func limitOf(n int) func(string) int { return func(string) int { return n } }

func hs(h ...uint64) []uint64 { return h }

func TestCheckLegalHistories(t *testing.T) {
	cases := []struct {
		name string
		m    Model
		ops  []Op
	}{
		{"tracking: sequential, limit reached, known series still accepted", TrackingModel(limitOf(2)), []Op{
			tr(0, 0, 1, "a", hs(1), OK),
			tr(0, 2, 3, "a", hs(1, 2, 3), Rejected, 3),
			tr(1, 4, 5, "a", hs(3, 2), Rejected, 3),
			tr(0, 6, 7, "a", hs(1, 2), OK),
		}},
		{"tracking: concurrent acceptance and rejection of the same new series", TrackingModel(limitOf(1)), []Op{
			// Client 1's rejection linearises before client 0's acceptance.
			tr(0, 0, 10, "a", hs(7), OK),
			tr(1, 1, 9, "a", hs(7), Rejected, 7),
			tr(1, 11, 12, "a", hs(7), OK),
		}},
		{"tracking: keys are independent", TrackingModel(limitOf(1)), []Op{
			tr(0, 0, 1, "a", hs(1), OK),
			tr(1, 0, 1, "b", hs(2), OK),
			tr(0, 2, 3, "a", hs(2), Rejected, 2),
			tr(1, 2, 3, "b", hs(1), Rejected, 1),
		}},
		{"tracking: an unknown outcome may or may not have taken effect", TrackingModel(limitOf(2)), []Op{
			tr(0, 0, 1, "a", hs(1, 2), Unknown),
			tr(1, 2, 3, "a", hs(1), Rejected, 1), // it did not…
			tr(2, 4, 5, "a", hs(2), OK),          // …or it did: both legal
			tr(0, 6, 7, "a", hs(5), Failed),
			tr(1, 8, 9, "a", hs(2), OK),
		}},
		{"metering: a retried event counts once, a span split over windows", MeteringModel(100), []Op{
			ev(0, 0, 1, "s1", 50, false, Unknown),
			ev(0, 2, 3, "s1", 50, false, OK), // the retry: same id
			ev(1, 2, 3, "s1", 50, false, OK), // a duplicate from elsewhere
			ev(0, 4, 5, "e1", 230, true, OK),
			usage(2, 6, 7, map[int64]int64{0: 50, 100: 100, 200: 30}),
		}},
		{"metering: an unknown stop may or may not have closed the span", MeteringModel(100), []Op{
			ev(0, 0, 1, "s1", 10, false, OK),
			ev(0, 2, 3, "e1", 20, true, Unknown),
			usage(1, 4, 5, map[int64]int64{0: 10}),
			ev(0, 6, 7, "s2", 40, false, OK),
			ev(0, 8, 9, "e2", 50, true, Failed),
			usage(1, 10, 11, map[int64]int64{0: 10, 100: 0}),
		}},
		{"runtime config: reads and compare-and-set", RuntimeConfigModel(1, "v1"), []Op{
			get(0, 0, 1, 1, "v1"),
			cas(0, 2, 5, 1, "v2", OK, 4), // the server may skip versions
			get(1, 3, 4, 1, "v1"),        // concurrent with the write: old value still legal
			cas(1, 6, 7, 1, "x", Rejected, 4),
			get(1, 8, 9, 4, "v2"),
		}},
		{"runtime config: unknown compare-and-set seen applied, then pinned", RuntimeConfigModel(1, "v1"), []Op{
			cas(0, 0, 1, 1, "v2", Unknown, 0),
			get(1, 2, 3, 7, "v2"),
			cas(1, 4, 5, 7, "v3", OK, 8),
			get(0, 6, 7, 8, "v3"),
		}},
		{"runtime config: unknown compare-and-set never applied", RuntimeConfigModel(1, "v1"), []Op{
			cas(0, 0, 1, 1, "v2", Unknown, 0),
			get(1, 2, 3, 1, "v1"),
			cas(1, 4, 5, 1, "v3", OK, 2),
			get(1, 6, 7, 2, "v3"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			html := filepath.Join(t.TempDir(), "history.html")
			if err := Check(tc.m, tc.ops, html, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(html); err == nil {
				t.Fatal("a legal history wrote a visualisation")
			}
		})
	}
}

func TestCheckCatchesBrokenHistories(t *testing.T) {
	cases := []struct {
		name string
		m    Model
		ops  []Op
	}{
		{"acknowledged series later rejected", TrackingModel(limitOf(10)), []Op{
			tr(0, 0, 1, "a", hs(1, 2), OK),
			tr(1, 2, 3, "a", hs(3), OK),
			tr(0, 4, 5, "a", hs(2), Rejected, 2),
		}},
		{"acknowledged series rejected by a request overlapping only later ones", TrackingModel(limitOf(10)), []Op{
			tr(0, 0, 1, "a", hs(1), OK),
			tr(1, 2, 10, "a", hs(2), OK),
			tr(2, 3, 9, "a", hs(1, 2), Rejected, 1, 2),
		}},
		{"accepting past the limit", TrackingModel(limitOf(2)), []Op{
			tr(2, 0, 1, "b", hs(1, 2), OK), // legal: not named
			tr(0, 0, 5, "a", hs(1, 2), OK),
			tr(1, 1, 4, "a", hs(3), OK),
		}},
		{"accepting past the limit after an unknown outcome", TrackingModel(limitOf(1)), []Op{
			tr(0, 0, 1, "a", hs(1), OK),
			tr(1, 2, 3, "a", hs(2), Unknown),
			tr(2, 4, 5, "a", hs(3), OK),
		}},
		{"stale read of the runtime config version", RuntimeConfigModel(1, "v1"), []Op{
			cas(0, 0, 1, 1, "v2", OK, 2),
			get(1, 2, 3, 1, "v1"),
		}},
		{"compare-and-set succeeded on an old version", RuntimeConfigModel(1, "v1"), []Op{
			cas(0, 0, 1, 1, "v2", OK, 2),
			cas(1, 2, 3, 1, "v3", OK, 3),
		}},
		{"compare-and-set lost on the current version", RuntimeConfigModel(1, "v1"), []Op{
			get(0, 0, 1, 1, "v1"),
			cas(0, 2, 3, 1, "v2", Rejected, 0),
		}},
		{"metering: a retried event counted twice", MeteringModel(100), []Op{
			ev(0, 0, 1, "s1", 50, false, OK),
			ev(0, 2, 3, "e1", 80, true, Unknown),
			ev(0, 4, 5, "e1", 80, true, OK),
			usage(1, 6, 7, map[int64]int64{0: 60}),
		}},
		{"metering: a window of a span lost", MeteringModel(100), []Op{
			ev(0, 0, 1, "s1", 50, false, OK),
			ev(0, 2, 3, "e1", 230, true, OK),
			usage(1, 4, 5, map[int64]int64{0: 50, 200: 30}),
		}},
		{"metering: usage from an event that failed", MeteringModel(100), []Op{
			ev(0, 0, 1, "s1", 50, false, OK),
			ev(0, 2, 3, "e1", 80, true, Failed),
			usage(1, 4, 5, map[int64]int64{0: 30}),
		}},
		{"read of a value never written", RuntimeConfigModel(1, "v1"), []Op{
			cas(0, 0, 1, 1, "v2", Unknown, 0),
			get(1, 2, 3, 2, "v9"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			html := filepath.Join(t.TempDir(), "history.html")
			err := Check(tc.m, tc.ops, html, 10*time.Second)
			if !errors.Is(err, ErrNotLinearizable) {
				t.Fatalf("Check = %v, want a linearizability violation", err)
			}
			if !strings.Contains(err.Error(), html) {
				t.Fatalf("error %q does not name the visualisation", err)
			}
			if !strings.Contains(err.Error(), `keys ["a"]`) && !strings.Contains(err.Error(), `keys ["doc"]`) {
				t.Fatalf("error %q does not name the failing key", err)
			}
			data, rerr := os.ReadFile(html)
			if rerr != nil || !strings.Contains(string(data), "<html") {
				t.Fatalf("visualisation %s: %v (%d bytes)", html, rerr, len(data))
			}
		})
	}
}

// A check sees only its model's kinds: tracking operations do not disturb the
// runtime-config check and vice versa.
func TestCheckFiltersKinds(t *testing.T) {
	ops := []Op{
		tr(0, 0, 1, "doc", hs(1), OK),
		get(1, 0, 1, 1, "v1"),
		tr(0, 2, 3, "doc", hs(1), OK),
	}
	if err := Check(TrackingModel(limitOf(1)), ops, "", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := Check(RuntimeConfigModel(1, "v1"), ops, "", time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestOverLimit: the limit checked apart from the per-partition keys counts
// distinct acknowledged series per tenant (the part before '#'), ignores
// refused hashes and unknown outcomes, and names the tenant over it.
func TestOverLimit(t *testing.T) {
	if got := TrackKey("t-a", 17); got != "t-a#17" {
		t.Fatalf("TrackKey = %q, want t-a#17", got)
	}
	ops := []Op{
		tr(0, 0, 1, TrackKey("a", 1), []uint64{1, 2}, OK),
		tr(0, 2, 3, TrackKey("a", 2), []uint64{3, 4}, Rejected, 4),
		tr(1, 2, 3, TrackKey("a", 1), []uint64{1, 2}, OK), // the same series again
		tr(1, 4, 5, TrackKey("a", 3), []uint64{5}, Unknown),
		tr(1, 4, 5, TrackKey("b", 3), []uint64{6, 7}, OK),
	}
	limits := map[string]int{"a": 3, "b": 2}
	if err := OverLimit(ops, func(tenant string) int { return limits[tenant] }); err != nil {
		t.Fatalf("within the limits: %v", err)
	}
	limits["a"], limits["b"] = 2, 0 // b: no limit
	err := OverLimit(ops, func(tenant string) int { return limits[tenant] })
	if err == nil || !strings.Contains(err.Error(), "tenant a: 3 distinct series acknowledged, over its limit 2") || strings.Contains(err.Error(), "tenant b") {
		t.Fatalf("a over its limit: got %v", err)
	}
}
