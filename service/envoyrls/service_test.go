package envoyrls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-io/tollgate/envoyrl"
)

// untilFull is how long the key's bucket takes to refill to a whole unit:
// (rpu − remaining) ÷ rate, rounded up to whole seconds, at least one while
// anything is used, 0 when full.
func TestUntilFull(t *testing.T) {
	perMin := envoyrl.OverrideRule("d", envoyrl.Minute, 60, []string{"k"}) // 1 token/s
	perHour := envoyrl.OverrideRule("d", envoyrl.Hour, 7, []string{"k"})   // 1 token per 514.3 s
	for _, c := range []struct {
		r         *envoyrl.Rule
		remaining uint64
		want      time.Duration
	}{
		{perMin, 60, 0}, {perMin, 61, 0}, {perMin, 59, time.Second}, {perMin, 0, time.Minute},
		{perHour, 7, 0}, {perHour, 6, 515 * time.Second}, {perHour, 0, time.Hour},
	} {
		if got := untilFull(c.r, c.remaining); got != c.want {
			t.Errorf("untilFull(%d/%v, remaining %d) = %v, want %v", c.r.Limit.RequestsPerUnit, c.r.Limit.Unit, c.remaining, got, c.want)
		}
	}
}

// The x-ratelimit-* headers name the tightest descriptor's remaining and
// reset, and every limited descriptor's quota with its window.
func TestRateLimitHeaders(t *testing.T) {
	sts := []*rlsv3.RateLimitResponse_DescriptorStatus{
		{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, LimitRemaining: 7, DurationUntilReset: durationpb.New(18 * time.Second)},
		{}, // no rule matched
		{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}, LimitRemaining: 2, DurationUntilReset: durationpb.New(3540 * time.Second)},
	}
	got := map[string]string{}
	for _, h := range rateLimitHeaders(sts, 2) {
		got[h.Key] = h.Value
	}
	want := map[string]string{"x-ratelimit-limit": "100, 10;w=60, 100;w=3600", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "3540"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("headers %v, want exactly %v", got, want)
	}
}
