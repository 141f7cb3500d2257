package checker

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// Nightly reads the long runs' settings: TOLLGATE_NIGHTLY, the run's length
// (at most 50 minutes: histories do not model idle expiry, and the nodes'
// longest idle timeout is 60 minutes), and TOLLGATE_NIGHTLY_SEED, which
// replays a run's fault sequence. It skips t when TOLLGATE_NIGHTLY is unset
// (what names the run) and fails it on a bad value. The seed is logged.
func Nightly(t testing.TB, what string) (length time.Duration, seed uint64, rng *rand.Rand) {
	t.Helper()
	v := os.Getenv("TOLLGATE_NIGHTLY")
	if v == "" {
		t.Skipf("%s; set TOLLGATE_NIGHTLY to its length, e.g. TOLLGATE_NIGHTLY=30m (docs/testing.md)", what)
	}
	length, err := time.ParseDuration(v)
	if err != nil || length <= 0 || length > 50*time.Minute {
		t.Fatalf("TOLLGATE_NIGHTLY=%q: want a duration up to 50m (acknowledged series must stay active for the whole run: the idle timeout is at most 60m)", v)
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("TOLLGATE_NIGHTLY_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("TOLLGATE_NIGHTLY_SEED=%q: want an unsigned integer", s)
		}
	}
	t.Logf("%s: %v, seed %d (TOLLGATE_NIGHTLY_SEED=%d replays the sequence)", what, length, seed, seed)
	return length, seed, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
